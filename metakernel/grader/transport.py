"""How inputs and outputs cross between the grader and the candidate's process, and the channel they cross on.

Nothing the candidate's process sends is unpickled: every message is JSON (plus raw byte blobs for CPU tensors),
so a reply cannot run code in the grader. Tensors never travel through torch's multiprocessing reductions, which
share a tensor's whole allocator segment (neighbouring parent memory, the anchor included) and keep their
reference counts in owner-only shared-memory files that a child of another uid cannot open.

On the GPU each child gets two **arenas**, raw device buffers the parent allocates on their own (a private memory
pool, or an exact-size segment: nothing else lives in them) and exports once by CUDA IPC (driver API, through
ctypes): the parent writes a draw's inputs into the input arena and tells the child where each tensor lies; the
child copies its returned tensors into the output arena after the timed window. So a call carries offsets, not
handles, and the child sees no parent memory but the two arenas. On a CPU machine tensors cross by value.
"""

from __future__ import annotations

import ctypes
import json
import threading
from multiprocessing.connection import Connection
from typing import Any

ALIGN = 256
MAX_FRAME = 1 << 31

#: The dtypes the transport carries: every problem's inputs and outputs are of these.
DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
          "float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64", "complex64", "complex128")


def dtype_name(dtype: Any) -> str:
    """`torch.bfloat16` -> "bfloat16"."""
    return str(dtype).removeprefix("torch.")


def known_dtype(dtype: Any) -> bool:
    """Whether the transport carries tensors of `dtype` (a torch dtype)."""
    return dtype_name(dtype) in DTYPES


def dtype_of(name: str) -> Any:
    """"bfloat16" -> `torch.bfloat16` (only plain dtypes)."""
    import torch

    if name not in DTYPES:
        raise ValueError(f"unsupported dtype {name!r}")
    return getattr(torch, name)


def aligned(n: int) -> int:
    """`n` rounded up to the arena alignment."""
    return (n + ALIGN - 1) // ALIGN * ALIGN


def extent_bytes(t: Any) -> int:
    """Bytes a strided tensor spans from its first element (its storage footprint)."""
    if t.numel() == 0:
        return 0
    span = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride(), strict=True))
    return span * t.element_size()


# ------------------------------------------------------------------------------------------------ the channel
def send(conn: Connection, obj: dict[str, Any], blobs: list[bytes] | None = None, _dumps: Any = json.dumps) -> None:
    """One message: a JSON frame (with the blob count), then the blobs.

    `_dumps` is bound when this file is imported (before any candidate code): rewriting this module's `json` or
    json's `dumps` (red-teamers did both, to scale the times a reply carries) does not reach it.
    """
    blobs = blobs or []
    conn.send_bytes(_dumps({**obj, "_blobs": len(blobs)}, allow_nan=True).encode())
    for blob in blobs:
        conn.send_bytes(blob)


def receive(conn: Connection, timeout: float | None = None) -> tuple[dict[str, Any], list[bytes]] | None:
    """The next message, or None when none came within `timeout`; raises EOFError when the peer is gone."""
    if timeout is not None and not conn.poll(timeout):
        return None
    raw = conn.recv_bytes(MAX_FRAME)
    obj = json.loads(raw.decode())
    if not isinstance(obj, dict):
        raise ValueError("a message must be a JSON object")
    count = int(obj.pop("_blobs", 0))
    blobs = [conn.recv_bytes(MAX_FRAME) for _ in range(count)]
    return obj, blobs


# ------------------------------------------------------------------------------------------------ CUDA IPC
class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]


class Driver:
    """The few CUDA driver calls the arenas need (libcuda, through ctypes; the context is torch's)."""

    def __init__(self) -> None:
        lib = ctypes.CDLL("libcuda.so.1")
        self.get_handle = lib.cuIpcGetMemHandle
        self.get_handle.argtypes = [ctypes.POINTER(_IpcHandle), ctypes.c_uint64]
        self.open_handle = lib.cuIpcOpenMemHandle_v2
        self.open_handle.argtypes = [ctypes.POINTER(ctypes.c_uint64), _IpcHandle, ctypes.c_uint]
        self.close_handle = lib.cuIpcCloseMemHandle
        self.close_handle.argtypes = [ctypes.c_uint64]
        self.range = lib.cuMemGetAddressRange_v2
        self.range.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t), ctypes.c_uint64]

    @staticmethod
    def _ok(rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{what} failed (CUDA driver error {rc})")

    def export(self, ptr: int) -> tuple[str, int, int]:
        """IPC handle (hex) of the allocation holding `ptr`, `ptr`'s offset in it and the allocation's size."""
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        self._ok(self.range(ctypes.byref(base), ctypes.byref(size), ptr), "cuMemGetAddressRange")
        handle = _IpcHandle()
        self._ok(self.get_handle(ctypes.byref(handle), base.value), "cuIpcGetMemHandle")
        return ctypes.string_at(ctypes.addressof(handle), 64).hex(), ptr - base.value, size.value

    def open(self, handle_hex: str) -> int:
        """Map another process's allocation; returns its base address here."""
        handle = _IpcHandle()
        raw = bytes.fromhex(handle_hex)
        ctypes.memmove(ctypes.addressof(handle), raw, len(raw))
        ptr = ctypes.c_uint64()
        self._ok(self.open_handle(ctypes.byref(ptr), handle, 1), "cuIpcOpenMemHandle")  # lazy peer access
        return ptr.value


class _CudaArray:
    """A bare `__cuda_array_interface__` over mapped memory, for `torch.as_tensor`."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 2, "strides": None}


def wrap_device_bytes(ptr: int, nbytes: int) -> Any:
    """A uint8 CUDA tensor over `nbytes` at `ptr` (memory this process mapped; the tensor does not own it)."""
    import torch

    return torch.as_tensor(_CudaArray(ptr, nbytes), device="cuda")


#: Held while a thread allocates into a private pool, destroys one, or empties torch's cache. While one thread is
#: inside `use_mem_pool`, torch counts a capture under way, and any other thread that then empties the cache or
#: destroys a pool trips its INTERNAL ASSERT `captures_underway.empty()` and aborts the process (two validation
#: runs side by side, sessions 24 and 26, the second with the backtrace through `~MemPool`).
GPU_MEMORY_LOCK = threading.RLock()


def release_cache() -> None:
    """`torch.cuda.empty_cache()`, never while another thread allocates into a private pool."""
    import torch

    with GPU_MEMORY_LOCK:
        torch.cuda.empty_cache()


def allocate_arena(nbytes: int) -> tuple[Any, Any]:
    """A uint8 CUDA buffer whose allocation holds nothing else, and the pool that keeps it (or None).

    A private `torch.cuda.MemPool` where torch has one; otherwise an exact-size segment of the caching allocator
    (a multiple of 2 MiB above its large-block threshold, after releasing cached blocks, so it is not carved out of
    a larger free segment). `export_arena` verifies the allocation's size either way.
    """
    import torch

    nbytes = max(nbytes, 1)
    size = (nbytes + (2 << 20) - 1) // (2 << 20) * (2 << 20)
    size = max(size, 32 << 20)
    pool = None
    mem_pool = getattr(torch.cuda, "MemPool", None)
    use_pool = getattr(torch.cuda, "use_mem_pool", None)
    with GPU_MEMORY_LOCK:
        if mem_pool is not None and use_pool is not None:
            pool = mem_pool()
            with use_pool(pool):
                buf = torch.empty(size, dtype=torch.uint8, device="cuda")
        else:
            torch.cuda.empty_cache()
            buf = torch.empty(size, dtype=torch.uint8, device="cuda")
    return buf, pool


def export_arena(driver: Driver, buf: Any) -> dict[str, Any]:
    """What the child needs to map `buf`; refuses a buffer whose allocation holds anything else."""
    handle, offset, size = driver.export(buf.data_ptr())
    nbytes = buf.numel()
    if offset != 0 or size > nbytes + (2 << 20):
        raise RuntimeError(f"arena allocation is shared (offset {offset}, allocation {size} B for {nbytes} B)")
    return {"handle": handle, "offset": offset, "nbytes": nbytes}


# ------------------------------------------------------------------------------------------------ tensor specs
def pack_value(value: Any, blobs: list[bytes]) -> Any:
    """A non-arena value as JSON.

    CPU tensors by value (a blob), meta tensors by shape and stride, containers recursively, plain scalars as is.
    """
    import torch

    if type(value) is torch.Tensor and value.is_meta:  # shapes only: the free check's full-scale trace
        return {"meta": True, "dtype": dtype_name(value.dtype), "shape": list(value.shape),
                "stride": list(value.stride())}
    if type(value) is torch.Tensor:
        c = value.detach().contiguous()
        raw = c.reshape(-1).view(torch.uint8).numpy().tobytes() if c.numel() else b""
        blobs.append(raw)
        return {"cpu": len(blobs) - 1, "dtype": dtype_name(c.dtype), "shape": list(c.shape)}
    if isinstance(value, torch.Tensor):
        raise TypeError(f"a {type(value).__name__} is not a plain torch.Tensor")
    if type(value) in (tuple, list):
        return {"seq": type(value).__name__, "items": [pack_value(v, blobs) for v in value]}
    if value is None or type(value) in (bool, int, float, str):
        return {"v": value}
    raise TypeError(f"cannot transfer a {type(value).__name__}")


def leaf_kinds(spec: Any) -> set[str]:
    """The kinds of leaf a spec tree holds ("at", "cpu", "meta", "v"); "?" for anything else."""
    if isinstance(spec, dict) and "seq" in spec and isinstance(spec.get("items"), list):
        return set().union(*(leaf_kinds(s) for s in spec["items"])) if spec["items"] else set()
    if isinstance(spec, dict):
        kinds = {k for k in ("at", "cpu", "meta", "v") if k in spec}
        return kinds if len(kinds) == 1 else {"?"}
    return {"?"}


def unpack_value(spec: Any, blobs: list[bytes], arena: Any = None) -> Any:
    """Inverse of `pack_value`, plus arena tensors (`{"at": offset, ...}` views of `arena`)."""
    import torch

    if "at" in spec:
        dtype = dtype_of(spec["dtype"])
        shape, stride = spec["shape"], spec["stride"]
        nbytes = spec["nbytes"]
        start = int(spec["at"])
        if arena is None or start < 0 or start + nbytes > arena.numel() or start % ALIGN:
            raise ValueError("tensor outside its arena")
        flat = arena[start:start + max(nbytes, 1)]
        itemsize = torch.empty((), dtype=dtype).element_size()
        return flat[:nbytes - nbytes % itemsize].view(dtype).as_strided(shape, stride) if nbytes else \
            torch.empty(shape, dtype=dtype, device=arena.device)
    if "meta" in spec:
        return torch.empty_strided(spec["shape"], spec["stride"], dtype=dtype_of(spec["dtype"]), device="meta")
    if "cpu" in spec:
        dtype = dtype_of(spec["dtype"])
        raw = blobs[int(spec["cpu"])]
        flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        return flat.view(dtype).reshape(spec["shape"]).clone()
    if "seq" in spec:
        items = [unpack_value(s, blobs, arena) for s in spec["items"]]
        return tuple(items) if spec["seq"] == "tuple" else items
    return spec["v"]


def place(values: list[Any], arena: Any, start: int = 0) -> tuple[list[Any], list[Any], int]:
    """Copy a draw's tensors into `arena` from `start`.

    Returns the arena views (same shape and strides), their specs and the next free offset; non-tensor values pass
    through as JSON.
    """
    placed: list[Any] = []
    specs: list[Any] = []
    at = aligned(start)
    for value in values:
        if hasattr(value, "is_cuda") and value.is_cuda:
            nbytes = extent_bytes(value)
            if at + nbytes > arena.numel():
                raise RuntimeError("a draw does not fit its arena")
            view = arena[at:at + max(nbytes, 1)][:nbytes].view(value.dtype).as_strided(
                value.shape, value.stride()) if nbytes else value.clone()
            view.copy_(value)
            placed.append(view)
            specs.append({"at": at, "dtype": dtype_name(value.dtype), "shape": list(value.shape),
                          "stride": list(value.stride()), "nbytes": nbytes})
            at = aligned(at + nbytes)
        else:
            blobs: list[bytes] = []
            spec = pack_value(value, blobs)
            if blobs:
                raise TypeError("CPU tensors among GPU inputs are not supported")
            placed.append(value)
            specs.append(spec)
    return placed, specs, at


def mask_stream(nbytes: int, key: int, device: str, randint: Any = None, generator: Any = None) -> Any:
    """`nbytes` uint8 of a keyed Philox stream: the same in the parent and the child for the same key and GPU.

    The parent XORs a row's later draws with it in the arena and the child XORs them back right before each one's
    call, so while a call runs the draws after it are noise to it (docs/integrity.md hole 9). The child passes
    the torch functions it bound before the candidate's import.
    """
    import torch

    g = (generator or torch.Generator)(device=device)
    g.manual_seed(int(key))
    return (randint or torch.randint)(0, 256, (int(nbytes),), dtype=torch.uint8, device=device, generator=g)


def draw_bytes(values: list[Any]) -> int:
    """Arena bytes one draw of these values needs."""
    return sum(aligned(extent_bytes(v)) for v in values if hasattr(v, "is_cuda") and v.is_cuda)
