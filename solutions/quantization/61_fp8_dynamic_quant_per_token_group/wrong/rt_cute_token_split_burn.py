"""Token route plus DSL-share padding: the eager answer split into two random-looking addends, added back by CuTe,
plus a CuTe kernel that only burns time on a scratch buffer.

Eager PyTorch quantizes; the bit patterns of x_q (as fp32) and x_scale are each split into (bits - noise, noise) with
fresh random int32 noise, a CuTe kernel adds the halves back in int32 (wrapping, so exactly), and eager reinterprets
the sum and casts to fp8. (The first version split fp32 magnitudes, whose sum rounds: on the H200 it came back
`wrong`, testing nothing.) No launch argument holds the answer in any form the audit tests (sums are not tested: an honest split-K combine is handed partials that add up), both
whole-call ablations break the outputs, and the burn lifts CuTe above half of the GPU time. The per-unit ablation
finds that the outputs do not depend on the burn's values: its time does not count, and the share is far below 50 %.

Category: token_route
Expected: rule_violation/dsl_share
"""

import torch
import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

GROUP = 128
THREADS = 256
BURN_PASSES = 40  # x ~0.11 ms: well above the eager part (~2.3 ms with the split)


@cute.kernel
def _add_kernel(mA: cute.Tensor, mB: cute.Tensor, mO: cute.Tensor):  # int32, wrapping
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * THREADS + tidx
    if i < mA.shape[0]:
        mO[i] = mA[i] + mB[i]


@cute.jit
def _add(mA: cute.Tensor, mB: cute.Tensor, mO: cute.Tensor, stream):
    n = mA.shape[0]
    _add_kernel(mA, mB, mO).launch(grid=[(n + THREADS - 1) // THREADS, 1, 1], block=[THREADS, 1, 1],
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


def _join(a, b, out):
    if "add" not in _FNS:
        v = make_fake_compact_tensor(cutlass.Int32, (cute.sym_int(),), assumed_align=16)
        _FNS["add"] = cute.compile(_add, v, v, v, make_fake_stream(use_tvm_ffi_env_stream=True),
                                   options="--enable-tvm-ffi")
    _FNS["add"](a, b, out)


def _eager(x):
    t, k = x.shape
    xg = x.float().view(t, k // GROUP, GROUP)
    amax = xg.abs().amax(-1, keepdim=True).clamp_min(1e-4)
    m, _ = torch.frexp(amax / 448.0)
    scale = torch.where(m == 0.5, amax / 448.0, amax / 448.0 / m)
    x_q = (xg / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(t, k)
    return x_q, scale.view(t, k // GROUP)


def _through_cute(value):
    bits = value.float().reshape(-1).view(torch.int32)
    noise = torch.randint(-(2 ** 31), 2 ** 31 - 1, bits.shape, dtype=torch.int32, device=bits.device)
    out = torch.empty_like(bits)
    _join((bits - noise).contiguous(), noise, out)  # int32 addition wraps: (bits - n) + n == bits exactly
    return out.view(torch.float32).view(value.shape).to(value.dtype)


def solve(x):
    x_q, x_scale = _eager(x)
    out_q, out_s = _through_cute(x_q), _through_cute(x_scale)
    burn_gpu(x.device, BURN_PASSES)
    return out_q, out_s
