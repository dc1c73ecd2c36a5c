"""Red team (session 28, second CPU round): device code as bytes of the file's own, moved into the traced module.

A traced value's `.ir_value().owner.owner` is the host function being traced, `type(compiled.ir_module).parse`
parses any text, and `op.move_before(...)` moved a `gpu.binary` (a ready device binary) into the module the DSL was
building. Neither the build check nor the PTX read sees inside a binary; the compile then failed on the CPU
(`mgpuModuleLoad` is not in the process), so nothing ran, but nothing refused it either. Now `.owner`,
`.ir_module`, `.move_before` and `.move_after` are refused by the static rules, and a `gpu.binary` in a module by
`cute_host.device_problem`.

Expected: rule_violation/static
"""

import cutlass
import cutlass.cute as cute
import torch

PROBE = {}
_BIN = """
module {
  gpu.binary @evil [#gpu.object<#nvvm.target<chip = "sm_90a">, bin = "UNCHECKED-DEVICE-BYTES">]
}
"""
_HOLD = {}


@cute.jit
def _host(a: cutlass.Int32):
    value = a.ir_value()
    func_op = value.owner.owner
    module_cls = _HOLD["module_cls"]
    parsed = module_cls.parse(_BIN)
    _HOLD["parsed"] = parsed
    for op in parsed.body.operations:
        op.move_before(func_op)
    PROBE["module_during_trace"] = str(func_op.parent)[:400]


@cute.jit
def _plain(a: cutlass.Int32):
    pass


def solve(x, residual, weight):
    _HOLD["module_cls"] = type(cute.compile(_plain, 1).ir_module)
    fn = cute.compile(_host, 1)
    text = str(fn.ir_module)
    PROBE["evil_in_compiled"] = "UNCHECKED-DEVICE-BYTES" in text
    h = x + residual
    return h, h
