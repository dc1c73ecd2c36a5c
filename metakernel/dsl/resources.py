"""What each compiled kernel asks of an H200 SM (from the sm_90a cubin the DSL built on the CPU) and its launches.

The free check compiles for sm_90a without a GPU; the cubin already says what the GPU will give each block:
registers per thread, the local-memory stack frame (register spills or local arrays), static shared memory and,
where the kernel fixed it, the block size. From those, the blocks an SM can hold and the occupancy they allow.
A choice such as 1024 threads per block or a 64 KB tile is then a number before a paid submission, not a guess.

Parsed straight from the ELF (no CUDA tool needed): `.text.<kernel>` carries the register count in the top byte of
its section header's `sh_info`, `.nv.shared.<kernel>` is the static shared memory, and the `.nv.info` attribute
records carry the frame size (EIATTR_FRAME_SIZE) and the fixed block size (EIATTR_REQNTID / EIATTR_MAX_THREADS).

The grid, the block and the dynamic shared memory are not in the cubin: the host code passes them at each launch
(CuTe's SmemAllocator sizes the dynamic part from the kernel's allocations, TIRx from its `shared.dyn` buffer). The
adapters read them from the host side of the intercepted launch (`Launch`: CuTe's lowered host code, TIRx's host
function evaluated on the call's arguments), so occupancy counts dynamic shared memory and the table shows the
grid and the waves it makes on 132 SMs, a kernel's first question after "does it fit". Whatever the host computes
only at run time stays None, and the table says it is not counted.
"""

from __future__ import annotations

import struct
from dataclasses import asdict, dataclass, replace
from typing import Any

from metakernel.grader.kernels import function_of

#: sm_90 (H100/H200) per-SM limits, CUDA C Programming Guide, compute capability 9.0; the H200 has 132 SMs.
SM90 = {"regs": 65536, "warps": 64, "blocks": 32, "smem": 233472, "smem_reserved": 1024, "reg_unit": 256,
        "sms": 132}

_EIATTR_REQNTID, _EIATTR_MAX_THREADS, _EIATTR_FRAME_SIZE, _EIATTR_REGCOUNT = 0x10, 0x05, 0x11, 0x2F


@dataclass
class KernelResources:
    """One kernel as the cubin describes it (None: not fixed at compile time)."""

    name: str
    registers: int
    stack_bytes: int  # local memory per thread: spills or local arrays
    static_smem: int
    threads: int | None  # the block size the kernel was compiled for, where it fixed one
    blocks_per_sm: int | None = None
    occupancy: float | None = None  # resident warps / 64, from registers, threads and shared memory
    limited_by: str | None = None
    # the launch (None: not intercepted, or computed by the host only at run time)
    grid: list[int] | None = None
    block: list[int] | None = None
    dynamic_smem: int | None = None
    waves: float | None = None  # blocks in the grid / (blocks_per_sm x 132 SMs)

    def as_dict(self) -> dict[str, Any]:
        """JSON form (what the child sends and the report keeps)."""
        return asdict(self)


def _sections(data: bytes) -> dict[str, tuple[int, int, int, int]]:
    """Map each section's name to (type, offset, size, info), for every section of an ELF64 little-endian file."""
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError("not a 64-bit ELF file (cubin)")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names_at = headers[shstrndx][4]
    out = {}
    for name_off, kind, _flags, _addr, offset, size, _link, info, _align, _entsize in headers:
        end = data.index(b"\0", names_at + name_off)
        out[data[names_at + name_off:end].decode(errors="replace")] = (kind, offset, size, info)
    return out


def _attributes(blob: bytes) -> list[tuple[int, bytes]]:
    """(attribute, payload) records of an `.nv.info` section: format byte, attribute byte, then the payload."""
    out, i = [], 0
    while i + 2 <= len(blob):
        fmt, attr = blob[i], blob[i + 1]
        i += 2
        if fmt == 0x04:  # EIFMT_SVAL: u16 size, then that many bytes
            size, = struct.unpack_from("<H", blob, i)
            out.append((attr, blob[i + 2:i + 2 + size]))
            i += 2 + size
        elif fmt == 0x03:  # EIFMT_HVAL: one u16
            out.append((attr, blob[i:i + 2]))
            i += 2
        elif fmt == 0x02:  # EIFMT_BVAL: one byte (padded to u16)
            out.append((attr, blob[i:i + 2]))
            i += 2
        elif fmt == 0x01:  # EIFMT_NVAL: no payload
            out.append((attr, b""))
        else:
            break  # an unknown format: stop rather than misread the rest
    return out


def from_cubin(data: bytes) -> list[KernelResources]:
    """Every kernel (`.text.<name>` section) in a cubin, with what it asks of an SM."""
    sections = _sections(data)
    kernels = []
    for section, (_kind, _offset, _size, info) in sections.items():
        if not section.startswith(".text."):
            continue
        name = section[len(".text."):]
        registers = info >> 24
        smem = sections.get(f".nv.shared.{name}", (0, 0, 0, 0))[2]
        threads: int | None = None
        stack = 0
        kind, offset, size, _ = sections.get(f".nv.info.{name}", (0, 0, 0, 0))
        for attr, payload in _attributes(data[offset:offset + size]) if size else []:
            if attr in (_EIATTR_REQNTID, _EIATTR_MAX_THREADS) and len(payload) >= 12:
                x, y, z = struct.unpack_from("<III", payload)
                threads = x * max(y, 1) * max(z, 1)
            elif attr == _EIATTR_FRAME_SIZE and len(payload) >= 4:
                stack = struct.unpack_from("<I", payload, len(payload) - 4)[0]
        kernels.append(KernelResources(name, registers, stack, smem, threads))
    _global_frames(sections, data, kernels)
    for k in kernels:
        occupancy(k)
    return kernels


def _global_frames(sections: dict[str, tuple[int, int, int, int]], data: bytes,
                   kernels: list[KernelResources]) -> None:
    """Frame sizes and register counts filed in the cubin-wide `.nv.info`, keyed by the kernel's symbol index."""
    kind, offset, size, _ = sections.get(".nv.info", (0, 0, 0, 0))
    if not size:
        return
    symbols = _symbol_names(sections, data)
    by_name = {k.name: k for k in kernels}
    for attr, payload in _attributes(data[offset:offset + size]):
        if attr not in (_EIATTR_FRAME_SIZE, _EIATTR_REGCOUNT) or len(payload) < 8:
            continue
        index, value = struct.unpack_from("<II", payload)
        kernel = by_name.get(symbols.get(index, ""))
        if kernel is None:
            continue
        if attr == _EIATTR_FRAME_SIZE:
            kernel.stack_bytes = max(kernel.stack_bytes, value)
        elif not kernel.registers:
            kernel.registers = value


def _symbol_names(sections: dict[str, tuple[int, int, int, int]], data: bytes) -> dict[int, str]:
    _, offset, size, _ = sections.get(".symtab", (0, 0, 0, 0))
    _, str_offset, _, _ = sections.get(".strtab", (0, 0, 0, 0))
    names = {}
    for i in range(size // 24):
        name_off, = struct.unpack_from("<I", data, offset + 24 * i)
        end = data.index(b"\0", str_offset + name_off)
        names[i] = data[str_offset + name_off:end].decode(errors="replace")
    return names


def parse_cubin(data: bytes) -> list[KernelResources]:
    """`from_cubin` that never raises: a malformed cubin only loses the resource table, never the check."""
    try:
        return from_cubin(bytes(data))
    except Exception:  # noqa: BLE001 - any malformed ELF (struct errors, OverflowError, bad indices)
        return []


@dataclass(frozen=True)
class Launch:
    """How the host launched one kernel, as far as it is known without running it (None: set only at run time)."""

    grid: tuple[int, int, int] | None = None
    block: tuple[int, int, int] | None = None
    dynamic_smem: int | None = None


class ResourceLog:
    """One adapter's parsed cubins by key, and which of them the launches since the last `take` used, how."""

    def __init__(self) -> None:
        self.kernels: dict[str, list[KernelResources]] = {}
        self.used: list[tuple[str, tuple[tuple[str, Launch], ...]]] = []

    def add(self, key: str, cubin: bytes) -> None:
        """Parse a module's cubin once, under a key that names the module (a hash of its source or bytes)."""
        if key not in self.kernels:
            self.kernels[key] = parse_cubin(cubin)

    def use(self, key: str, launches: dict[str, Launch] | None = None) -> None:
        """A launch of that module was intercepted; `launches`: its kernels' launch configurations by symbol.

        A module launched again with another configuration (another grid at another shape) is another row set.
        """
        entry = (key, tuple(sorted((launches or {}).items())))
        if entry not in self.used:
            self.used.append(entry)

    def take(self) -> list[dict[str, Any]]:
        """Rows of the modules used since the last call (the dry run's table for one request)."""
        rows: list[dict[str, Any]] = []
        for key, launches in self.used:
            by_name = dict(launches)
            for k in self.kernels.get(key, []):
                row = with_launch(k, by_name.get(k.name)).as_dict()
                if row not in rows:
                    rows.append(row)
        self.used = []
        return rows


def with_launch(k: KernelResources, launch: Launch | None) -> KernelResources:
    """A copy of the cubin's row with the launch's grid, block and dynamic shared memory, occupancy recomputed."""
    if launch is None:
        return k
    return occupancy(replace(k, grid=list(launch.grid) if launch.grid else None,
                             block=list(launch.block) if launch.block else None,
                             dynamic_smem=launch.dynamic_smem))


def _product(dims: list[int]) -> int:
    out = 1
    for d in dims:
        out *= max(int(d), 1)
    return out


def occupancy(k: KernelResources, limits: dict[str, int] = SM90) -> KernelResources:
    """Blocks per SM and occupancy from registers, threads and shared memory, static plus the launch's dynamic part.

    The block size is the cubin's where the kernel fixed one (the launch must match it), else the launch's. The
    1 KB the SM reserves per block is counted once: an sm_90 cubin's `.nv.shared.<kernel>` already holds it whenever
    the kernel uses shared memory at all (256 B declared: 1280; dynamic only: 1024; none: no section; compiled with
    nvcc for sm_90a, `test_an_sm90_cubin_s_shared_size_holds_the_1_kb_reserve`), so it is added only to a kernel
    whose cubin shows none.
    """
    threads = k.threads or (_product(k.block) if k.block else None)
    if not threads:
        return k
    warps = -(-threads // 32)
    regs_per_warp = -(-max(k.registers, 1) * 32 // limits["reg_unit"]) * limits["reg_unit"]
    bounds = {
        "registers": (limits["regs"] // regs_per_warp) // warps,
        "threads": limits["warps"] // warps,
        "blocks": limits["blocks"],
        "shared memory": limits["smem"] // (k.static_smem + (k.dynamic_smem or 0)
                                            + (0 if k.static_smem else limits["smem_reserved"])),
    }
    k.limited_by = min(bounds, key=lambda b: bounds[b])
    k.blocks_per_sm = bounds[k.limited_by]
    k.occupancy = k.blocks_per_sm * warps / limits["warps"]
    k.waves = _product(k.grid) / (k.blocks_per_sm * limits["sms"]) if k.grid and k.blocks_per_sm else None
    return k


def _dims(dims: list[int] | None) -> str:
    return "x".join(str(d) for d in dims) if dims else "?"


def _waves(waves: float | None) -> str:
    return "?" if waves is None else f"{waves:.2f}" if waves < 10 else f"{waves:.0f}"


def table(rows: list[dict[str, Any]], width: int = 40) -> str:
    """A compact text table for the agent's check text (one line per kernel launch)."""
    if not rows:
        return ""
    names = [function_of(r["name"]) for r in rows]  # CuTe spells every argument's type
    names = [n if len(n) <= width else n[:width - 3] + "..." for n in names]
    width = max(6, *(len(n) for n in names))
    dyn_known = all(r.get("dynamic_smem") is not None for r in rows)
    unknown = "" if dyn_known and all(r.get("grid") for r in rows) else \
        ", ? = set only at run time" + ("" if dyn_known else ", a ? dyn B not counted")
    head = (f"kernel resources (sm_90a cubin; grid, block and dynamic shared memory as launched{unknown}; "
            "H200: 132 SMs):")
    lines = [head,
             f"  {'kernel':{width}s} {'regs':>4s} {'stack B':>7s} {'smem B':>7s} {'dyn B':>7s} {'threads':>7s}"
             f" {'grid':>14s} {'blocks/SM':>9s} {'occupancy':>9s} {'waves':>6s}  limited by"]
    for name, r in zip(names, rows, strict=True):
        occ = f"{100 * r['occupancy']:.0f} %" if r.get("occupancy") is not None else "?"
        dyn = r.get("dynamic_smem")
        threads = r["threads"] or (_dims(r["block"]) if r.get("block") else "?")
        lines.append(f"  {name:{width}s} {r['registers']:>4d} {r['stack_bytes']:>7d} {r['static_smem']:>7d} "
                     f"{'?' if dyn is None else dyn:>7} {threads:>7} {_dims(r.get('grid')):>14s} "
                     f"{r.get('blocks_per_sm') or '?':>9} {occ:>9s} {_waves(r.get('waves')):>6s}  "
                     f"{r.get('limited_by') or 'block size not fixed at compile time nor known from the launch'}")
    if any(r["stack_bytes"] for r in rows):
        lines.append("  stack B > 0: local memory per thread (register spills or local arrays), slow on the GPU")
    if any(r.get("waves") is not None and r["waves"] < 1 for r in rows):
        lines.append("  waves < 1: fewer blocks than the 132 SMs hold at once, part of the GPU idles")
    return "\n".join(lines)


__all__ = ["KernelResources", "Launch", "ResourceLog", "from_cubin", "occupancy", "parse_cubin", "table",
           "with_launch"]
