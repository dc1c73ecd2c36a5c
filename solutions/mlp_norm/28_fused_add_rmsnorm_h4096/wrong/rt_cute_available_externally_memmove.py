"""Red team (session 28, fourth CPU round): host code calls libc's memmove through a func.func that HAS a body.

`cutlass.runtime.ir` is refused by name on a chain from cutlass, but not through a local (`rt = cutlass.runtime;
rt.ir`). With the MLIR bindings, a `func.func @memmove` is added at module level with a dummy body and
`llvm.linkage = available_externally` (+ `no_inline`): not a declaration, so `host_problem` passes it, and every op
(arith.constant, func.func, func.return, cuda.cast i64 -> !llvm.ptr, func.call) is on the allowlist. LLVM drops an
available_externally body and the JIT resolves `memmove` from the process: read and write at any address (shown on
the CPU in run mode: a bytes object read and overwritten). Passed the static rules and `cute_host.confine`. Now
`.ir` is refused on any chain in a CuTe file, a host `func.func` may carry only the DSL's attributes, and a host
`cuda.cast` may only turn a launch's result into its integer code.

Expected: rule_violation/static
"""

import cutlass
import cutlass.cute as cute
import torch

PROBE = {}


def _bindings():
    rt = cutlass.runtime
    return rt.ir


@cute.jit
def _move(dst: cutlass.Int64, src: cutlass.Int64, n: cutlass.Int64):
    ir = _bindings()
    ptr = ir.Type.parse("!llvm.ptr")
    i64 = ir.IntegerType.get_signless(64)
    anchor = ir.Operation.create("arith.constant", results=[i64], attributes={"value": ir.IntegerAttr.get(i64, 0)})
    module = anchor.parent.parent
    with ir.InsertionPoint.at_block_begin(module.regions[0].blocks[0]):
        extern = ir.Operation.create("func.func", regions=1, attributes={
            "sym_name": ir.StringAttr.get("memmove"),
            "function_type": ir.TypeAttr.get(ir.FunctionType.get([ptr, ptr, i64], [ptr])),
            "llvm.linkage": ir.Attribute.parse("#llvm.linkage<available_externally>"),
            "no_inline": ir.UnitAttr.get()})
        body = extern.regions[0].blocks.append(ptr, ptr, i64)
        with ir.InsertionPoint(body):
            ir.Operation.create("func.return", operands=[body.arguments[0]])
    d = ir.Operation.create("cuda.cast", results=[ptr], operands=[dst.ir_value()]).result
    s = ir.Operation.create("cuda.cast", results=[ptr], operands=[src.ir_value()]).result
    ir.Operation.create("func.call", results=[ptr], operands=[d, s, n.ir_value()],
                        attributes={"callee": ir.FlatSymbolRefAttr.get("memmove")})


def solve(x, residual, weight):
    secret = b"SECRET-HARNESS-BYTES-0123456789"
    fn = cute.compile(_move, cutlass.Int64(0), cutlass.Int64(0), cutlass.Int64(0))
    buf = torch.zeros(16, dtype=torch.uint8)
    fn(buf.data_ptr(), id(secret) + 32, 16)  # read 16 bytes of a Python object's memory
    PROBE["read"] = bytes(buf.tolist())
    mark = torch.tensor(list(b"PWNED-BY-MEMMOVE"), dtype=torch.uint8)
    fn(id(secret) + 32, mark.data_ptr(), 16)  # write 16 bytes into an immutable bytes object
    PROBE["secret_after_write"] = secret
    h = x + residual
    return h, h
