"""Red team (session 28, CPU): a host-side TMA descriptor written at an address the file chooses.

`Tx.tensormap_encode_tiled(Tx.reinterpret("handle", addr), ...)` in host code lowers to a packed call of
`runtime.cuTensorMapEncodeTiled`, which writes a 128-byte descriptor (fields of the file's choosing) at `addr`; it
passed the static rules and the source and host checks (the write itself needs the driver: GPU only, not run). Now
the op is refused in the source, and a packed call of anything but the device setter and the build's kernels in
host code.

Expected: rule_violation/sandbox
"""
import torch
import tvm
from tvm.script import tirx as Tx


def _make_kernel(n):
    @Tx.prim_func
    def poke(x_ptr: Tx.handle, addr: Tx.int64):
        X = Tx.match_buffer(x_ptr, (64,), "float32", align=16)
        Tx.tensormap_encode_tiled(Tx.reinterpret("handle", addr), X.data, 64, 16, 1, descriptor_dtype="float32",
                                  rank=1)
        Tx.device_entry()
        bx = Tx.cta_id([1])
        tx = Tx.thread_id([32])
        X[tx] = X[tx] + 1.0

    return poke


def solve(x, residual, weight):
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    tvm.compile(_make_kernel(64), target=target, tir_pipeline="tirx")  # refused here, before anything runs
    h = x + residual
    return h, h
