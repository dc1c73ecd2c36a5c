"""Foreign kernel disguised as a library kernel: jiterator (NVRTC) does the norm under a name starting with "at_".

The new attribution calls a profiled kernel "library" when its name is demangled C++ or starts with a vendor
prefix (metakernel/grader/kernels.py: "at_", "cub", "gemm", "cutlass", "flash", ...), "dsl" when it is a symbol
the DSL compiled, and "foreign" otherwise. A jiterator function named `at_rms_apply` is JIT-compiled by NVRTC into
`at_rms_apply..._kernel`: a plain C identifier with a library prefix, so it passes as a torch kernel. CuTe adds
x + residual (required: both ablations break the outputs) and a CuTe burn kernel keeps CuTe above half of the GPU
time. jiterator is reached through functools.singledispatch's annotation evaluation, so no static rule sees the
name. A kernel JIT-compiled in the candidate's process is foreign whatever its name.

Category: foreign_kernel
Expected: rule_violation/foreign_kernel
"""

import functools

import torch
import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

VEC = 8
THREADS = 256
EPS = 1e-5
BURN_ITERS = 400_000

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


BURN_CTAS = 132
BURN_THREADS = 256


@cute.kernel
def _burn_kernel(mS: cute.Tensor, mIt: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    acc = cutlass.Float32(1.0)
    for i in range(mIt[0]):  # a dependent multiply-add chain: pure GPU time, result unused by anyone
        acc = acc * cutlass.Float32(0.9999999) + cutlass.Float32(1e-7)
    mS[bidx * BURN_THREADS + tidx] = acc


@cute.jit
def _burn(mS: cute.Tensor, mIt: cute.Tensor, stream):
    _burn_kernel(mS, mIt).launch(grid=[BURN_CTAS, 1, 1], block=[BURN_THREADS, 1, 1], stream=stream)


_BURN = {}


def burn_gpu(device, iters):
    """Keep BURN_CTAS x BURN_THREADS threads busy for `iters` dependent FMAs (about 2 ns each on an H200)."""
    if "fn" not in _BURN:
        s = make_fake_compact_tensor(cutlass.Float32, (BURN_CTAS * BURN_THREADS,), assumed_align=16)
        it = make_fake_compact_tensor(cutlass.Int32, (1,), assumed_align=4)
        _BURN["fn"] = cute.compile(_burn, s, it, make_fake_stream(use_tvm_ffi_env_stream=True),
                                   options="--enable-tvm-ffi")
        _BURN["s"] = torch.empty(BURN_CTAS * BURN_THREADS, dtype=torch.float32, device=device)
    if _BURN.get("iters") != iters:
        _BURN["it"] = torch.full((1,), iters, dtype=torch.int32, device=device)
        _BURN["iters"] = iters
    _BURN["fn"](_BURN["s"], _BURN["it"])

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
    burn_gpu(x.device, BURN_ITERS)
    return out, h
