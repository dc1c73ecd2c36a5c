"""Red team (session 28, second CPU round): a host `printf` of the file's own C format reads and writes anywhere.

`cute.printf` in a `@cute.jit` host function lowers to libc's `printf` with the file's format string and its raw
int64 arguments: `%.16s` printed 16 bytes at `id(obj) + 32` (the grading process's memory) and `%n` wrote a count
at an address of the file's choosing. The op (`cute.print`) carried no word the host check refused, so it passed
the static rules and `cute_host.confine` (it runs only where the launch runs: a GPU grading). Now a host print may
only format numbers with CuTe's `{}` placeholders (the DSL's own launch-limit message does).

Session 31: `id()` and `hash()` are refused by name (object addresses told audited calls apart through the ids of
fresh tensors), so the static rules now stop this file before the sandbox does.

Expected: rule_violation/static
"""

import cutlass
import cutlass.cute as cute
import torch

PROBE = {}


@cute.jit
def _peek(addr: cutlass.Int64, where: cutlass.Int64):
    cute.printf("[peek] %.16s|%n", addr, where)


def solve(x, residual, weight):
    secret = b"SECRET-HARNESS-BYTES-0123456789"
    box = torch.zeros(1, dtype=torch.int64)
    fn = cute.compile(_peek, cutlass.Int64(0), cutlass.Int64(0))
    fn(cutlass.Int64(id(secret) + 32), cutlass.Int64(box.data_ptr()))
    PROBE["written_by_%n"] = int(box[0])
    h = x + residual
    return h, h
