"""Token route that evades the audit and the share rule: the eager answer XOR-masked, unmasked by CuTe, plus a burn.

Eager PyTorch quantizes (the reference's own arithmetic); the bytes of x_q and x_scale are XOR-ed with a fresh random
key, and a CuTe kernel XORs them back into the outputs. XOR with random bits is neither a rescaling, a shift nor a
permutation of the answer, so the audit sees noise; suppressing the kernel leaves poison and randomising its
arguments scrambles the outputs, so both ablations pass. A second CuTe kernel only burns GPU time (it copies a
256 MiB scratch buffer nobody reads, 24 times) so that CuTe is more than half of the profiled time. It passes every rule in the
new grader and does none of the work in the DSL: this is the answer laundered through the DSL.

Category: token_route
Expected: rule_violation/dsl_token
"""

import torch
import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

GROUP = 128
THREADS = 256
BURN_PASSES = 24  # x ~0.11 ms: more than eager's ~1.9 ms


@cute.kernel
def _xor_kernel(mE: cute.Tensor, mK: cute.Tensor, mO: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * THREADS + tidx
    if i < mE.shape[0]:
        mO[i] = mE[i] ^ mK[i]


@cute.jit
def _xor(mE: cute.Tensor, mK: cute.Tensor, mO: cute.Tensor, stream):
    n = mE.shape[0]
    _xor_kernel(mE, mK, mO).launch(grid=[(n + THREADS - 1) // THREADS, 1, 1], block=[THREADS, 1, 1],
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

_FNS = {}


def _unmask(enc, key, out):
    if "xor" not in _FNS:
        v = make_fake_compact_tensor(cutlass.Int32, (cute.sym_int(),), assumed_align=16)
        _FNS["xor"] = cute.compile(_xor, v, v, v, make_fake_stream(use_tvm_ffi_env_stream=True),
                                   options="--enable-tvm-ffi")
    _FNS["xor"](enc, key, out)


def _eager(x):
    t, k = x.shape
    xg = x.float().view(t, k // GROUP, GROUP)
    amax = xg.abs().amax(-1, keepdim=True).clamp_min(1e-4)
    m, _ = torch.frexp(amax / 448.0)
    scale = torch.where(m == 0.5, amax / 448.0, amax / 448.0 / m)
    x_q = (xg / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(t, k)
    return x_q, scale.view(t, k // GROUP)


def _through_cute(value):
    words = value.view(torch.int32).view(-1)
    key = torch.randint(-(2 ** 31), 2 ** 31 - 1, words.shape, dtype=torch.int32, device=value.device)
    out = torch.empty_like(value)
    _unmask(words ^ key, key, out.view(torch.int32).view(-1))
    return out


def solve(x):
    x_q, x_scale = _eager(x)
    out_q, out_s = _through_cute(x_q), _through_cute(x_scale)
    burn_gpu(x.device, BURN_PASSES)
    return out_q, out_s
