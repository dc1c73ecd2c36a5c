"""Foreign kernel under the DSL's own name: hand-written PTX, loaded with the CUDA driver, named as CuTe's kernel.

CuTe copies the blocks of the first 4 of the 64 (layer, K/V) rows; a hand-written PTX kernel copies the other 60.
The PTX is loaded with cuModuleLoadData and launched with cuLaunchKernel (cuda.bindings.driver, which the CuTe
variant may import), and its `.entry` is given exactly the symbol CuTe compiled (read from the compiled object's
`kernel_info`). The profiler then shows two kernels of that one name, and exact-symbol attribution counts both as
CuTe: DSL share ~100 %, nothing foreign. Both ablations break the output (the CuTe rows stay uncopied), the audit
skips the MUTATES cache. The driver calls are made from code evaluated through functools.singledispatch, so the
static rule that allows only CUstream/CUresult from the driver never sees them. A GPU kernel that did not come
out of the DSL's compiler is foreign whatever it is called.

Category: foreign_kernel
Under protocol 2 the evaluated code never runs: the audit hook refuses compiling a string that is not a type
expression (what this file would get past the audit hook alone: rule_violation/foreign_kernel).

Expected: rule_violation/sandbox
"""

import functools

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

THREADS = 256
WORD_VEC = 4  # 32-bit words per 128-bit access


@cute.kernel
def _block_copy_kernel(mKV: cute.Tensor, mMap: cute.Tensor, copy: cute.TiledCopy):
    tidx, _, _ = cute.arch.thread_idx()
    pair, lk, _ = cute.arch.block_idx()
    words = mKV.shape[2]  # words per block (compile-time)
    src = cutlass.Int32(mMap[pair, 0])
    dst = cutlass.Int32(mMap[pair, 1])

    gS = cute.local_tile(mKV, tiler=(1, 1, words), coord=(lk, src, 0))[0, 0, None]
    gD = cute.local_tile(mKV, tiler=(1, 1, words), coord=(lk, dst, 0))[0, 0, None]
    part = copy.get_slice(tidx)
    tS = part.partition_S(gS)
    tD = part.partition_D(gD)
    rV = cute.make_fragment_like(tS)
    cute.copy(copy, tS, rV)  # every load first
    cute.copy(copy, rV, tD)  # then every store


@cute.jit
def _block_copy(mKV: cute.Tensor, mMap: cute.Tensor, stream):
    atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), mKV.element_type, num_bits_per_copy=128)
    copy = cute.make_tiled_copy_tv(atom, cute.make_layout(THREADS), cute.make_layout(WORD_VEC))
    _block_copy_kernel(mKV, mMap, copy).launch(
        grid=[mMap.shape[0], mKV.shape[0], 1], block=[THREADS, 1, 1], stream=stream)


_COMPILED = {}


def _compiled_for(rows, num_blocks, words, pairs):
    key = (rows, num_blocks, words, pairs)
    fn = _COMPILED.get(key)
    if fn is None:
        kv = make_fake_compact_tensor(cutlass.Int32, (rows, num_blocks, words), stride_order=(2, 1, 0),
                                      assumed_align=16)
        mapping = make_fake_compact_tensor(cutlass.Int64, (pairs, 2), stride_order=(1, 0), assumed_align=8)
        fn = cute.compile(_block_copy, kv, mapping, make_fake_stream(use_tvm_ffi_env_stream=True),
                          options="--enable-tvm-ffi")
        _COMPILED[key] = fn
    return fn

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
DRIVER = '''
import cuda.bindings.driver as drv
import torch

def load(ptx_text, name):
    err, mod = drv.cuModuleLoadData(ptx_text.encode())
    if int(err) != 0:
        raise RuntimeError(f"cuModuleLoadData: {err}")
    err, fn = drv.cuModuleGetFunction(mod, name.encode())
    if int(err) != 0:
        raise RuntimeError(f"cuModuleGetFunction: {err}")
    return (mod, fn)

def launch(handle, grid, block, args64, args32):
    mod, fn = handle
    v64 = torch.tensor(args64, dtype=torch.int64)
    v32 = torch.tensor(args32, dtype=torch.int32)
    ptrs = [v64.data_ptr() + 8 * i for i in range(len(args64))] + [v32.data_ptr() + 4 * i for i in range(len(args32))]
    params = torch.tensor(ptrs, dtype=torch.int64)
    stream = drv.CUstream(torch.cuda.current_stream().cuda_stream)
    (err,) = drv.cuLaunchKernel(fn, *grid, *block, 0, stream, params.data_ptr(), 0)
    if int(err) != 0:
        raise RuntimeError(f"cuLaunchKernel: {err}")
    return (v64, v32, params)

_BOX["load"] = load
_BOX["launch"] = launch
'''

PTX = """
.version 8.0
.target sm_90
.address_size 64

.visible .entry NAME(
    .param .u64 p_kv,
    .param .u64 p_map,
    .param .u32 p_nb,
    .param .u32 p_lk0
)
{
    .reg .u32 %r<8>;
    .reg .u32 %v<16>;
    .reg .b64 %rd<12>;

    ld.param.u64 %rd1, [p_kv];
    ld.param.u64 %rd2, [p_map];
    ld.param.u32 %r1, [p_nb];
    ld.param.u32 %r2, [p_lk0];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ctaid.y;
    add.u32 %r4, %r4, %r2;
    mov.u32 %r5, %tid.x;
    mul.wide.u32 %rd3, %r3, 16;
    add.s64 %rd3, %rd2, %rd3;
    ld.global.u64 %rd4, [%rd3];
    ld.global.u64 %rd5, [%rd3+8];
    mul.wide.u32 %rd6, %r4, %r1;
    add.s64 %rd7, %rd6, %rd4;
    add.s64 %rd8, %rd6, %rd5;
    shl.b64 %rd7, %rd7, 14;
    shl.b64 %rd8, %rd8, 14;
    add.s64 %rd7, %rd1, %rd7;
    add.s64 %rd8, %rd1, %rd8;
    mul.wide.u32 %rd9, %r5, 16;
    add.s64 %rd7, %rd7, %rd9;
    add.s64 %rd8, %rd8, %rd9;
    ld.global.v4.u32 {%v0, %v1, %v2, %v3}, [%rd7];
    ld.global.v4.u32 {%v4, %v5, %v6, %v7}, [%rd7+4096];
    ld.global.v4.u32 {%v8, %v9, %v10, %v11}, [%rd7+8192];
    ld.global.v4.u32 {%v12, %v13, %v14, %v15}, [%rd7+12288];
    st.global.v4.u32 [%rd8], {%v0, %v1, %v2, %v3};
    st.global.v4.u32 [%rd8+4096], {%v4, %v5, %v6, %v7};
    st.global.v4.u32 [%rd8+8192], {%v8, %v9, %v10, %v11};
    st.global.v4.u32 [%rd8+12288], {%v12, %v13, %v14, %v15};
    ret;
}
"""

CUTE_ROWS = 4  # (layer, K/V) rows copied by CuTe; the PTX kernel copies the rest
_PTX = {}


def solve(kv_caches, block_mapping):
    """kv_caches[:, :, dst] = kv_caches[:, :, src]: 4 rows by CuTe, 60 by PTX that carries CuTe's kernel name."""
    layers, kv, num_blocks = kv_caches.shape[:3]
    block_bytes = kv_caches[0, 0, 0].numel() * kv_caches.element_size()
    pairs = block_mapping.shape[0]
    if pairs == 0:
        return None
    rows, words = layers * kv, block_bytes // 4
    kv_words = kv_caches.view(torch.uint8).view(rows, num_blocks, block_bytes).view(torch.int32)
    mapping = block_mapping.contiguous()
    head = min(CUTE_ROWS, rows)
    compiled = _compiled_for(head, num_blocks, words, pairs)
    compiled(kv_words[:head], mapping)
    if rows == head:
        return None
    if not kv_caches.is_cuda or block_bytes != 16384:  # the CPU dry run (or another geometry): CuTe does it all
        _compiled_for(rows - head, num_blocks, words, pairs)(kv_words[head:], mapping)
        return None
    if "fn" not in _PTX:
        _define(DRIVER)
        name = list(compiled.kernel_info)[0]
        _PTX["name"] = name
        _PTX["fn"] = _BOX["load"](PTX.replace("NAME", name), name)
    _PTX["keep"] = _BOX["launch"](_PTX["fn"], (pairs, rows - head, 1), (256, 1, 1),
                                  [kv_words.data_ptr(), mapping.data_ptr()], [num_blocks, head])
    return None
