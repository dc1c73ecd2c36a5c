"""Foreign kernel: the norm is CUDA C compiled by NVRTC (cuda-python) and launched through the driver API.

CuTe only adds x + residual (needed: suppress it and h, hence both outputs, are garbage). The old static rules
refused `import cuda...` statements, not `__builtins__["__import__"]("cuda.bindings.nvrtc")`; the old grader had
no foreign-kernel rule and counted nothing but launches, so an NVRTC kernel doing the real work passed. The new
static rules refuse the dunder name and strings; the runtime refuses importing cuda.bindings.nvrtc; the profiler
attribution would call `rt_rmsnorm` foreign.

Category: foreign_kernel
Expected: rule_violation/static
"""

import torch
import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

VEC = 8
THREADS = 256
EPS = 1e-5

CUDA_SRC = rb"""
extern "C" __global__ void rt_rmsnorm(const unsigned short* h, const unsigned short* w, unsigned short* out,
                                      int n, float eps) {
    __shared__ float part[32];
    const unsigned short* row = h + (long long)blockIdx.x * n;
    unsigned short* dst = out + (long long)blockIdx.x * n;
    float sq = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = __uint_as_float(((unsigned)row[i]) << 16);
        sq += v * v;
    }
    for (int o = 16; o > 0; o >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = sq;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.f;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (threadIdx.x == 0) part[0] = v;
    }
    __syncthreads();
    float inv = rsqrtf(part[0] / n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = __uint_as_float(((unsigned)row[i]) << 16) * inv * __uint_as_float(((unsigned)w[i]) << 16);
        unsigned u = __float_as_uint(v);
        u += 0x7fffu + ((u >> 16) & 1u);
        dst[i] = (unsigned short)(u >> 16);
    }
}
"""


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


_FNS = {}


def _compiled(n):
    if n not in _FNS:
        fake = make_fake_compact_tensor(cutlass.BFloat16, (cute.sym_int(), n), stride_order=(1, 0), assumed_align=16)
        _FNS[n] = cute.compile(add, fake, fake, fake, make_fake_stream(use_tvm_ffi_env_stream=True),
                               options="--enable-tvm-ffi")
    return _FNS[n]


def _nvrtc_kernel():
    if "fn" in _FNS:
        return _FNS["fn"]
    imp = __builtins__["__import__"]
    nvrtc = imp("cuda.bindings.nvrtc", fromlist=["x"])
    drv = imp("cuda.bindings.driver", fromlist=["x"])
    _, prog = nvrtc.nvrtcCreateProgram(CUDA_SRC, b"rt_rmsnorm.cu", 0, [], [])
    nvrtc.nvrtcCompileProgram(prog, 1, [b"--gpu-architecture=compute_90"])
    _, size = nvrtc.nvrtcGetPTXSize(prog)
    ptx = b" " * size
    nvrtc.nvrtcGetPTX(prog, ptx)
    _, module = drv.cuModuleLoadData(ptx)
    _, fn = drv.cuModuleGetFunction(module, b"rt_rmsnorm")
    _FNS["fn"] = (drv, fn)
    return _FNS["fn"]


def _launch_norm(h, weight, out):
    drv, fn = _nvrtc_kernel()
    rows, n = h.shape
    ptrs = torch.tensor([h.data_ptr(), weight.data_ptr(), out.data_ptr()], dtype=torch.int64)
    n_arg = torch.tensor([n], dtype=torch.int32)
    eps_arg = torch.tensor([EPS], dtype=torch.float32)
    params = torch.tensor([ptrs.data_ptr(), ptrs.data_ptr() + 8, ptrs.data_ptr() + 16, n_arg.data_ptr(),
                           eps_arg.data_ptr()], dtype=torch.int64)
    stream = drv.CUstream(torch.cuda.current_stream().cuda_stream)
    drv.cuLaunchKernel(fn, rows, 1, 1, 256, 1, 1, 0, stream, params.data_ptr(), 0)
    _FNS["keep"] = (ptrs, n_arg, eps_arg, params)  # alive until the launch has read them


def solve(x, residual, weight):
    x, residual, weight = x.contiguous(), residual.contiguous(), weight.contiguous()
    h = torch.empty_like(x)
    _compiled(x.shape[1])(x, residual, h)
    if not x.is_cuda:  # the CPU dry run: no driver
        hf = h.float()
        return (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + EPS) * weight.float()).to(x.dtype), h
    out = torch.empty_like(x)
    _launch_norm(h, weight, out)
    return out, h
