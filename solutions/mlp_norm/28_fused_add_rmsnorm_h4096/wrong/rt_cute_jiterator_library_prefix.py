"""Foreign kernel disguised as a library kernel: jiterator (NVRTC) does the norm under a name starting with "at_".

The new attribution calls a profiled kernel "library" when its name is demangled C++ or starts with a vendor
prefix (metakernel/grader/kernels.py: "at_", "cub", "gemm", "cutlass", "flash", ...), "dsl" when it is a symbol
the DSL compiled, and "foreign" otherwise. A jiterator function named `at_rms_apply` is JIT-compiled by NVRTC into
`at_rms_apply..._kernel`: a plain C identifier with a library prefix, so it passes as a torch kernel. CuTe adds
x + residual (required: both ablations break the outputs) and a CuTe burn kernel keeps CuTe above half of the GPU
time. jiterator is reached through functools.singledispatch's annotation evaluation, so no static rule sees the
name. A kernel JIT-compiled in the candidate's process is foreign whatever its name.

Category: foreign_kernel
Under protocol 2 the evaluated code never runs: the audit hook refuses compiling a string that is not a type
expression (what this file would get past the audit hook alone: rule_violation/foreign_kernel).

Expected: rule_violation/sandbox
"""

import functools

import torch
import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

VEC = 8
THREADS = 256
EPS = 1e-5
BURN_PASSES = 10

JIT_CODE = "template <typename T> T at_rms_apply(T h, T inv, T w) { return h * inv * w; }"


@cute.kernel
def add_kernel(mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    nvec = mA.shape[1] // VEC
    i = bidx * THREADS + tidx
    if i < mA.shape[0] * nvec:
        row = i // nvec
        col = i - row * nvec
        a = cute.local_tile(mA, (1, VEC), (row, col))[0, None].load().to(cutlass.Float32)
        b = cute.local_tile(mB, (1, VEC), (row, col))[0, None].load().to(cutlass.Float32)
        cute.local_tile(mC, (1, VEC), (row, col))[0, None].store((a + b).to(mC.element_type))


@cute.jit
def add(mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, stream):
    total = mA.shape[0] * (mA.shape[1] // VEC)
    add_kernel(mA, mB, mC).launch(grid=[(total + THREADS - 1) // THREADS, 1, 1], block=[THREADS, 1, 1],
                                  stream=stream)


BURN_COLS = 1024
BURN_ROWS = 65536  # 64 Mi floats = 256 MiB per buffer
BURN_VEC = 4
BURN_THREADS = 256


@cute.kernel
def _burn_kernel(mA: cute.Tensor, mB: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    nvec = mA.shape[1] // BURN_VEC
    i = bidx * BURN_THREADS + tidx
    if i < mA.shape[0] * nvec:
        row = i // nvec
        col = i - row * nvec
        v = cute.local_tile(mA, (1, BURN_VEC), (row, col))[0, None].load()
        cute.local_tile(mB, (1, BURN_VEC), (row, col))[0, None].store(v)


@cute.jit
def _burn(mA: cute.Tensor, mB: cute.Tensor, stream):
    total = mA.shape[0] * (mA.shape[1] // BURN_VEC)
    _burn_kernel(mA, mB).launch(grid=[(total + BURN_THREADS - 1) // BURN_THREADS, 1, 1],
                                block=[BURN_THREADS, 1, 1], stream=stream)


_BURN = {}


def burn_gpu(device, passes):
    """Pure GPU time in CuTe: copy a 256 MiB scratch buffer `passes` times (~0.11 ms each); nobody reads it."""
    if "fn" not in _BURN:
        m = make_fake_compact_tensor(cutlass.Float32, (BURN_ROWS, BURN_COLS), stride_order=(1, 0), assumed_align=16)
        _BURN["fn"] = cute.compile(_burn, m, m, make_fake_stream(use_tvm_ffi_env_stream=True),
                                   options="--enable-tvm-ffi")
        _BURN["a"] = torch.zeros(BURN_ROWS, BURN_COLS, dtype=torch.float32, device=device)
        _BURN["b"] = torch.empty_like(_BURN["a"])
    for _ in range(passes):
        _BURN["fn"](_BURN["a"], _BURN["b"])

_BOX = {}


def _evaluate(source):
    """Evaluate the expression `source` with this module's globals, without eval in this file.

    functools.singledispatch's register() reads the function's annotation and, when it is a string, resolves it with
    typing.get_type_hints, which evaluates it. The annotation below is a variable, so the static rules (which parse
    only string constants written as annotations) never see the text; the code it runs is compiled as "<string>".
    """
    dispatcher = functools.singledispatch(lambda value: value)

    def probe(value: source):
        return value

    dispatcher.register(probe)


def _define(code):
    """Run statements `code` in this module's globals; what they put into _BOX is how they talk back."""
    _BOX["code"] = code
    _evaluate("exec(_BOX['code'], globals()) or int")

_FNS = {}


def _compiled(n):
    if n not in _FNS:
        fake = make_fake_compact_tensor(cutlass.BFloat16, (cute.sym_int(), n), stride_order=(1, 0), assumed_align=16)
        _FNS[n] = cute.compile(add, fake, fake, fake, make_fake_stream(use_tvm_ffi_env_stream=True),
                               options="--enable-tvm-ffi")
    return _FNS[n]


def _apply(hf, inv, wf):
    if not hf.is_cuda:
        return hf * inv * wf
    if "jit" not in _BOX:
        _BOX["src"] = JIT_CODE
        _evaluate("_BOX.update(jit=torch.cuda.jiterator._create_jit_fn(_BOX['src'])) or int")
    return _BOX["jit"](hf, inv.expand_as(hf).contiguous(), wf.expand_as(hf).contiguous())


def solve(x, residual, weight):
    x, residual, weight = x.contiguous(), residual.contiguous(), weight.contiguous()
    h = torch.empty_like(x)
    _compiled(x.shape[1])(x, residual, h)
    hf = h.float()
    inv = torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + EPS)
    out = _apply(hf, inv, weight.float()).to(x.dtype)
    burn_gpu(x.device, BURN_PASSES)
    return out, h
