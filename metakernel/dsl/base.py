"""One protocol every kernel DSL adapter implements (docs/design.md section 4, last bullets).

The grader never branches on the DSL: it asks the adapter to import the DSL, to route every kernel launch
through a `LaunchGate` (count / suppress / intercept), to run the dry-run check, to clean error text and to give
the prompt guide. A third DSL is one new module implementing `DslAdapter`.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass
class AuditedLaunch:
    """One launch of an audit call, as the grader's token audit reads it.

    Copies of its tensor arguments before it ran and, where the route has an after-hook, after it returned; where
    those arguments live; and the compiled unit it ran.
    """

    before: list[Any]
    unit: tuple[str, ...]
    addresses: list[int]
    after: list[Any] | None = None
    live: list[Any] = field(default_factory=list, repr=False)  # the arguments themselves, until after_launch


@dataclass
class LaunchGate:
    """What the launch hooks consult and update on every DSL kernel launch.

    mode:
      - "run": launch normally and count it.
      - "suppress": count it but do NOT launch (ablation: outputs must then be wrong). Its tensor arguments that
        are not problem inputs (`protected`) get random values instead, as if a kernel had written garbage: left
        alone, an output buffer can hold an answer eager code computed in memory the allocator handed out again,
        and the verdict would depend on the allocator (a CI run read such stale memory as "outputs correct").
      - "intercept": count it and do NOT launch (dry run on a CPU machine, after compilation succeeded).
    `kernel_names` collects the device-function names of launched kernels, for profiler attribution.
    `audit`: copy every launch's tensor arguments before it runs (token kernels are handed the answer), and again
    after it returned (`AuditedLaunch.after`, None where a route has no after-hook), so the grader can tell an
    answer handed in from one an earlier DSL launch of the same call computed.
    `randomize`: the dependency ablation. Before each launch its tensor arguments are overwritten with random
    values (floats) or shuffled (integers, so indices stay in range); after it, every element the launch did not
    write gets its value back (`after_launch`), so eager code after the launch sees the true inputs. If the
    outputs are still right, the values the DSL computed did not matter.
    `only`: restrict "suppress" and `randomize` to the launches of one compiled unit (the set of device symbols a
    launch runs); other launches run untouched. The grader asks this per unit so that a DSL kernel whose values
    the outputs do not depend on (time burnt on scratch memory to pad the DSL share) does not count as DSL work.
    `units`: the distinct units launched since the last `reset`.
    `isolate`: the isolation ablation (docs/integrity.md hole 12). Before each launch every byte the candidate's
    eager code could have written (`reachable`: the caching allocator's segments, the input arena) is overwritten
    with random bytes, except the spans of the launch's own tensor arguments; after it, every byte gets its value
    back (free blocks too, so that nothing read after the launch tells an isolated call from another). A kernel
    that reads only its arguments gives the same outputs; one that reaches an eager answer by address arithmetic
    from an argument (`anchor.iterator + offset`, `A[offset + i]` on a one-element buffer) reads noise.
    `isolated` counts the bytes overwritten (-1 once the gate found no room to copy them, -2 once the allocator
    could not be listed).
    """

    mode: str = "run"
    launches: int = 0
    suppressed: int = 0
    kernel_names: set[str] = field(default_factory=set)
    audit: bool = False
    audited: list[AuditedLaunch] = field(default_factory=list)
    randomize: bool = False
    randomized: int = 0
    only: frozenset[str] | None = None
    units: set[tuple[str, ...]] = field(default_factory=set)
    protected: frozenset[int] = frozenset()  # storage addresses of the problem inputs (never poisoned)
    isolate: bool = False
    isolated: int = 0
    # () -> [uint8 tensor]: the memory a candidate's eager code can write, live or free, all of it restored after
    # the launch. Set by the child; None: nothing to isolate.
    reachable: Any = None
    # () -> bytes of page-locked host memory handed out (torch's host allocator): GPU kernels can read it by address
    # and the isolation cannot fill it, so an isolated launch records the most it saw live (`pinned_live`).
    pinned: Any = None
    pinned_live: int = 0
    # bytes to isolate above which a failure to copy them is the file's (`isolated` -1), below it the machine's (-2)
    room: int = 0
    # () -> None: the device synchronisation bound before the file's import (the child's); it tells a dead CUDA
    # context from a failure of the gate's own work (`_context_lost`). None: no device.
    sync: Any = None
    # out-of-memory errors of the gate's own copies, over the child's life (never reset): the rest are the file's
    own_ooms: int = 0
    # the gate's own work that failed inside a launch (its copies, fills, perturbations): a file could catch the
    # error in solve and tell that call apart (session 31's fourth red-teamer: a 2^40-element expanded argument
    # whose audit copy ran out of memory), so the child ends the grading on any (`Child._check_clean`)
    failures: list[str] = field(default_factory=list)
    # A private CUDA memory pool for the gate's own tensors (audit copies, random fills, saved arguments): made in
    # the caching allocator's default pool they moved where the kernel's next allocation landed, so a probe launch
    # at the start of `solve` told an audited call from the others (session 22's red-teamer). None: the CPU.
    pool: Any = None
    _restore: list[Any] = field(default_factory=list)
    _garbled: list[Any] = field(default_factory=list)
    _isolated: list[Any] = field(default_factory=list)
    _strided: list[Any] = field(default_factory=list)
    _generators: dict[str, Any] = field(default_factory=dict)
    _pad_state: Any = None
    _isolated_pads: bool = False

    def should_launch(self, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None,
                      names: tuple[str, ...] | frozenset[str] = (), opaque: bool = False) -> bool:
        """Record one launch; True when the hook must really launch it.

        Adapters pass the launch's arguments and the device symbols it runs: in an audit call the torch tensors
        among the arguments are copied BEFORE the kernel runs, so the grader can tell a token kernel (one handed
        the finished answer) from real work. `opaque`: the hook sees only the DSL's packed arguments (raw
        addresses), not the caller's; the gate refuses such a launch wherever it would have to read them.
        """
        self.launches += 1
        unit = tuple(sorted(names))
        self.units.add(unit)
        targeted = self.only is None or bool(self.only.intersection(unit))
        if opaque and (self.mode != "run" or self.audit or self.randomize):
            refuse_native_code("a launch whose arguments the grader cannot read (a @cute.jit function called "
                               "directly, or a compiled program run by hand): compile with cute.compile(..., "
                               "options='--enable-tvm-ffi') and call the compiled function with torch tensors")
        if self.mode == "intercept":  # the free check refuses what an audit would (`_tensors` fails closed)
            _tensors(args, kwargs or {})
        if self.audit:
            live = _tensors(args, kwargs or {})
            with self._aside():
                self.audited.append(AuditedLaunch([_audit_copy(t) for t in live], unit,
                                                  [t.data_ptr() for t in live], live=live))
        if self.randomize and self.mode == "run" and targeted:
            with self._aside():
                self._perturb(args, kwargs or {})
        if self.isolate and self.mode == "run":
            with self._aside():
                self._isolate(_tensors(args, kwargs or {}))
        if self.mode == "run" or (self.mode == "suppress" and not targeted):
            return True
        self.suppressed += 1
        if self.mode == "suppress":
            with self._aside():
                self._garble(args, kwargs or {})
        return False

    @contextlib.contextmanager
    def _aside(self) -> Iterator[None]:
        """Allocations of the gate's own go to its private pool (`pool`), not where the kernel's land.

        Where the pool cannot be entered the gate allocates as before: a failure of ours must never surface inside
        the kernel's call, where it would be charged to the kernel. Its out-of-memory errors are counted
        (`own_ooms`), so that the child does not take them for the file's.
        """
        try:
            with self._pooled():
                yield
        except Exception as exc:
            if _context_lost(exc, self.sync):
                # An earlier launch faulted (CUDA reports it asynchronously, at the gate's next call): the kernel's
                # failure, not ours. The context is dead, so nothing the file does after catching it can tell a
                # call apart; a randomised index that sent an honest gather out of bounds is a crash, "required"
                # (session 32: gold 43, 50 and 51 were refused as "could not ablate").
                raise
            self.own_ooms += type(exc).__name__ == "OutOfMemoryError"
            self.failures.append(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
            raise

    @contextlib.contextmanager
    def _pooled(self) -> Iterator[None]:
        if self.pool is None:
            yield
            return
        import torch

        try:
            routed = torch.cuda.use_mem_pool(self.pool)
            routed.__enter__()
        except Exception:  # noqa: BLE001 - the pool is a hardening, never a reason to fail a launch
            self.pool = None
            yield
            return
        try:
            yield
        finally:
            routed.__exit__(None, None, None)

    def _garble(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        import torch

        for tensor in map(_writable, _tensors(args, kwargs)):
            if tensor.numel() == 0 or tensor.untyped_storage().data_ptr() in self.protected:
                continue
            # given back once the call has returned, unless its outputs lie there (`give_back_garbled`): a table
            # the file keeps between calls stayed garbage for the rest of the grading, and an honest kernel read
            # `dsl_reach` (session 32's false-positive review)
            tensor = _computable(tensor)
            self._garbled.append((tensor, tensor.clone()))
            gen = self._generator(tensor, "ablate")
            if not _fill_random(tensor, gen):
                info = torch.iinfo(tensor.dtype)
                tensor.copy_(torch.randint(max(info.min, -2**31), min(info.max, 2**31 - 1), tensor.shape,
                                           device=tensor.device, dtype=torch.int64, generator=gen).to(tensor.dtype))

    def give_back_garbled(self, outputs: Any) -> None:
        """After a suppressed call: the garbled arguments' values back, except where the call's outputs lie.

        The outputs stay garbage (that is the ablation); what the file keeps between calls (a table, a scale, a
        workspace) is as it was, so the calls after this one see what a process that was never ablated sees.
        """
        garbled, self._garbled = self._garbled, []
        if not garbled:
            return
        kept = [_span(t) for t in _returned(outputs) if t.numel() > 0]
        with self._aside():
            for view, saved in reversed(garbled):
                start, end = _span(view)
                if not any(start < b and a < end for a, b in kept):
                    view.copy_(saved)

    def after_launch(self) -> None:
        """Called by the hooks once a launch returned: give back the values of every element it did not write.

        Problem inputs then hold their true values for eager code after the launch, and an argument the kernel
        only reads (a sentinel that would reveal the ablation) looks untouched; what the kernel wrote stays.
        In an audit call, the launch's tensor arguments are copied once it finished. Everything here and in
        `_perturb` is queued on the current stream, the launch's own (TVM-FFI and TIRx launch there), with no host
        synchronisation: a kernel that polls its stream right after a launch saw it idle in audited and perturbed
        calls only, while the gate waited for the GPU (session 29's red-teamer ran its honest path exactly then).
        """
        if not (self.audit or self._isolated or self._strided or self._restore):
            return  # a plain launch: nothing to copy or give back, and no pool to enter inside the timed bracket
        last = self.audited[-1] if self.audit and self.audited else None
        if last is not None and last.after is None:  # (a launch with no tensor argument: an empty record)
            with self._aside():
                last.after = [t.detach().clone() for t in last.live]
            last.live = []
        with self._aside():
            self._give_back()
        if not self._restore:
            return
        import torch

        with self._aside():
            # newest first: an argument passed twice (or two overlapping views) was saved the second time with
            # the first randomisation's values, and restoring in launch order left those in place (session 32's
            # red-teamer: a multiplier of ones passed twice stayed random, so its outputs broke with no DSL work)
            for view, saved, perturbed in reversed(self._restore):
                view.copy_(torch.where(view == perturbed, saved, view))
            self._restore = []

    def _isolate(self, tensors: list[Any]) -> None:
        """Noise in every reachable byte outside the launch's tensor arguments (`isolate`), every byte saved first.

        What is kept is what the arguments' views address, not their whole storages: a one-element view of a larger
        allocation holding the answer is the hole this closes. A contiguous view keeps its span; a strided one only
        its elements (`_distinct`: a two-element view with a stride reaching past the answer kept the whole span
        between them in the protocol 6 review, the answer with it), put back after the fill. Free blocks are saved and
        given back too, not only live ones: a block freed before the launch and allocated after it held noise in
        isolated calls only, which told them apart (seen in review of protocol 6, rt_cute_isolation_tell), so a
        second launch could take the honest path exactly there. Saved copies go to the gate's private pool, which
        `reachable` leaves out (the child offers nothing without that pool: a copy landing in a block about to be
        filled would be lost); where the device has no room for them, to host memory (slower, but a file that
        keeps most of the card cached cannot make the ablation inconclusive that way: the protocol 6 review).
        """
        self._give_back()  # (a route without an after-hook: the last launch's bytes first)
        if self.sync is not None and self.reachable is not None and self.isolated >= 0:
            # work of the file's still running on another stream reads its own inputs, which the fill is about to
            # overwrite: an honest shared-expert GEMM beside a DSL launch read noise (session 32's review)
            self.sync()
        if self.pinned is not None:
            try:
                self.pinned_live = max(self.pinned_live, int(self.pinned()))
            except Exception:  # noqa: BLE001 - the host allocator's statistics: a hardening, never a failure
                self.pinned = None
        if self.reachable is None or self.isolated < 0:
            return
        tensors = [t for t in tensors if t.numel() > 0]
        kept = sorted(_span(t) for t in tensors if t.is_contiguous())
        own = [_distinct(t) for t in tensors if not t.is_contiguous()]
        own = [view if view is None else _alias(view) for view in own]
        if any(view is None for view in own):  # a view that addresses its elements many times over (session 31's
            self.isolated = -1  # red-teamer: 12 G elements of one byte made the gate's copies fail): the file's
            return
        # The copies allocate: where the allocator had to free cached segments to make room for them, the listing
        # no longer holds (its free blocks may be unmapped, or the copies' own), so it is taken again and the
        # copies made again (session 31's fourth red-teamer: noise written to an unmapped block is a crash, which
        # an isolated call judges the kernel's)
        for place in (None, None, "cpu"):
            try:
                regions = list(self.reachable())
                pieces = [region[start - region.data_ptr():end - region.data_ptr()] for region in regions
                          for start, end in _outside(region.data_ptr(), region.data_ptr() + region.numel(), kept)]
            except Exception:  # noqa: BLE001 - the allocator's own listing failed: never the kernel's failure
                self.isolated = -2
                return
            try:
                self._isolated = [(view, *self._save(view, place)) for view in pieces]
                strided = [(view, view.clone()) for view in own]
            except Exception as exc:  # noqa: BLE001 - our copies (out of memory): never the kernel's failure
                self._isolated, self._isolated_pads = [], False
                self.own_ooms += type(exc).__name__ == "OutOfMemoryError"  # (the child counts the file's apart)
                continue
            if _layout(self.reachable()) == _layout(regions):
                break
            self._isolated, self._isolated_pads = [], False
        else:  # no room on the device or the host: nothing isolated for the rest of the call, and whose fault is it?
            # a file whose memory outgrows `room` (a share of the card no gold kernel comes near) made it so; below
            # that, other gradings on the machine did: never the kernel's failure
            self.isolated = -1 if sum(view.numel() for view in pieces) > self.room else -2
            return
        for view in pieces:
            view.random_(0, 256, generator=self._generator(view, "noise"))
            self.isolated += view.numel()
        for view, values in strided:  # a strided argument's own elements, back before the launch
            view.copy_(values)
        self._strided = [view for view, _ in strided]

    def _perturb(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        for tensor in map(_writable, _tensors(args, kwargs)):
            if tensor.numel() == 0:
                continue
            tensor = _computable(tensor)
            saved = tensor.clone()
            gen = self._generator(tensor, "ablate")
            if not _fill_random(tensor, gen):
                _redraw_integers(tensor, gen)
            self._restore.append((tensor, saved, tensor.clone()))
            self.randomized += 1

    def _save(self, view: Any, place: str | None) -> tuple[Any, bool]:
        """A copy of `view` to give back after the launch: on the device, XORed with a pad of secret random bytes.

        Saved bytes are never filled (the pool is left out of `reachable`), so a verbatim copy of an eager answer
        would lie on the card while the launch runs; session 31's third red-teamer steered the gate's first
        allocation to an address of the file's choosing (an out-of-memory flush, then a freed block of the
        copy's size). Masked, the copy says nothing without the pad, which the gate draws from its own generator
        in 64 MiB pieces and draws again, from the same state, to unmask (`_load`). Host copies are pageable
        memory, out of the GPU's reach: plain.
        """
        if place is not None:
            return view.to(place), False
        import torch

        if not self._isolated_pads:
            pads = self._generator(view, "pad")
            self._pad_state = (pads, pads.get_state())
            self._isolated_pads = True
        saved = torch.empty_like(view)
        self._xor_pad(saved, view)
        return saved, True

    def _load(self, view: Any, saved: Any, masked: bool) -> None:
        if masked:
            self._xor_pad(view, saved)
        else:
            view.copy_(saved)

    def _xor_pad(self, target: Any, source: Any) -> None:
        """`target` = `source` XOR the next pad bytes, drawn into `target` itself (no pad lies beside it)."""
        import torch

        for lo in range(0, target.numel(), PAD_BYTES):
            chunk = target[lo:lo + PAD_BYTES]
            torch.randint(0, 256, chunk.shape, dtype=chunk.dtype, device=chunk.device,
                          generator=self._generator(target, "pad"), out=chunk)
            chunk.bitwise_xor_(source[lo:lo + PAD_BYTES])

    def _generator(self, like: Any, purpose: str) -> Any:
        """One of the gate's own random generators (one per purpose and device), seeded from the OS.

        The pads must be secret, and the default generators must not move in ablated calls only: torch's default
        CUDA generator starts from a fixed seed, so a file's own `torch.Generator(device="cuda")` reproduces its
        stream and could count the draws the gate made (a tell that let a file break its outputs exactly when
        its launches were suppressed or randomised, so that they read "required").
        """
        key = f"{purpose}:{like.device}"
        found = self._generators.get(key)
        if found is None:
            import secrets

            import torch

            found = torch.Generator(device=like.device)
            found.manual_seed(secrets.randbits(63))
            self._generators[key] = found
        return found

    def _give_back(self) -> None:
        """The bytes an isolated launch saw as noise, restored (free blocks too: nothing after it shows the noise).

        A strided argument's elements lie inside the restored bytes: what the launch wrote there is kept.
        """
        if self._isolated and self.sync is not None:
            self.sync()  # the launch and any stream beside it done with the noise before it goes
        written = [(view, view.clone()) for view in self._strided]
        if self._isolated and self._pad_state is not None:
            self._pad_state[0].set_state(self._pad_state[1])  # the same pads again, in the same order
        for view, saved, masked in self._isolated:
            self._load(view, saved, masked)
        for view, values in written:
            view.copy_(values)
        if self._isolated and self.sync is not None:
            self.sync()  # every byte back before the file's next work, on any stream
        self._isolated, self._strided, self._isolated_pads = [], [], False

    def reset(self) -> None:
        """Forget counts (kernel names are kept: they describe compiled kernels, not calls)."""
        self.launches = 0
        self.suppressed = 0
        self.audited = []
        self.randomized = 0
        self.isolated = 0
        self.pinned_live = 0
        self._isolated_pads = False
        self._isolated = []
        self._strided = []
        self.units = set()
        self._restore = []
        self._garbled = []


#: dtypes torch can draw into and compare directly; any other (float4_e2m1fn_x2, unsigned 16-64-bit, ...) is
#: written through a signed integer view of the same element size
_COMPUTABLE = ("float16", "bfloat16", "float32", "float64", "complex64", "complex128", "float8_e4m3fn",
               "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "bool", "int8", "uint8", "int16", "int32",
               "int64")
_SIGNED = {1: "int8", 2: "int16", 4: "int32", 8: "int64"}


def _fill_random(tensor: Any, gen: Any) -> bool:
    """Fresh random values for a floating, complex or bool tensor (True); False for an integer one (the caller's)."""
    import torch

    if tensor.is_floating_point() or tensor.is_complex():
        tensor.copy_(torch.randn(tensor.shape, device=tensor.device, generator=gen).to(tensor.dtype))
    elif tensor.dtype == torch.bool:
        tensor.copy_(torch.rand(tensor.shape, device=tensor.device, generator=gen) < 0.5)
    else:
        return False
    return True


def _redraw_integers(tensor: Any, gen: Any) -> None:
    """The randomise ablation's integers: values the kernel can still index with, but not the ones it was handed."""
    import torch

    if tensor.numel() > 1:
        # drawn with replacement from the tensor's own values: indices stay in range, and counts, sums and sorts
        # change too (a shuffle left an honest histogram's outputs as they were: `dsl_unused`, session 32's
        # false-positive review); int32 positions (int64 ones took 8 GiB for a 1 GiB cache)
        flat = tensor.reshape(-1)
        index_type = torch.int32 if flat.numel() < 2**31 else torch.int64
        picks = torch.randint(0, flat.numel(), (flat.numel(),), device=tensor.device, dtype=index_type,
                              generator=gen)
        tensor.copy_(flat[picks].reshape(tensor.shape))
    else:
        # a one-element integer (a flag or a count) moves by a small nonzero step: a red-teamer's launch that only
        # zeroed a flag its outputs add was never randomised, so the ablation said nothing; below 128: no 8-bit wrap
        # to itself; drawn on the device (a host copy waited for the GPU in randomised calls only: session 31's
        # fourth red-teamer)
        tensor.add_(torch.randint(1, 100, tensor.shape, device=tensor.device, dtype=tensor.dtype, generator=gen))


def _computable(tensor: Any) -> Any:
    """`tensor`, or a same-bytes integer view of it where torch has no random fill or arithmetic for its dtype.

    An honest NVFP4 kernel handed its codes as float4_e2m1fn_x2 made the ablations' fills raise, which reads as
    "the grader could not ablate" (session 32's false-positive review, on the CPU).
    """
    import torch

    name = str(tensor.dtype).removeprefix("torch.")
    if name in _COMPUTABLE:
        return tensor
    signed = _SIGNED.get(tensor.element_size())
    return tensor if signed is None else tensor.view(getattr(torch, signed))


def _context_lost(exc: BaseException, sync: Any) -> bool:
    """True when `exc` is a CUDA error after which the context is unusable (a sticky error: every later call fails).

    Decided by the device, not the message: after a non-sticky CUDA error (an invalid argument of the gate's own
    call) the device synchronises, and the failure stays the gate's. `sync` is bound before the file's import, so
    the file cannot make it raise.
    """
    if sync is None or ("CUDA error" not in str(exc) and type(exc).__name__ != "AcceleratorError"):
        return False
    try:
        sync()
    except Exception:  # noqa: BLE001 - the probe's failure is the answer
        return True
    return False


def _tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """The torch tensors among a launch's arguments.

    Fails closed: memory the gate cannot see as a torch tensor is refused (`_unreadable`), since the audit, the
    ablations and the poison fill would all pass it by. Session 29's red-teamer handed the eager answer to a CuTe
    copy kernel as `cute.runtime.from_dlpack` tensors, which have no `__dlpack__`: the audit copied nothing and the
    randomise ablation randomised nothing ("not conclusive").
    """
    import torch

    out = []
    for value in (*args, *kwargs.values()):
        tensor = value if isinstance(value, torch.Tensor) else None
        if tensor is None and hasattr(value, "__dlpack__") and not isinstance(value, type):
            # another library's tensor (TVM's): its launch may not run on torch's current stream, where the gate
            # queues its copies (TVM takes the stream from torch tensor arguments only)
            refuse_native_code(f"a launch argument of type {type(value).__name__}: pass torch tensors")
        if tensor is None and _stream(value):
            refuse_native_code(
                f"a launch on a stream the file chose ({type(value).__name__} argument): launch on torch's current "
                "stream (CuTe: the TVM-FFI environment stream), where the grader's audit and ablations are ordered")
        if tensor is None and _unreadable(value):
            refuse_native_code(
                f"a launch argument the grader cannot read ({type(value).__name__}: a DSL's own wrapper of device "
                "memory); pass torch tensors (CuTe: the TVM-FFI route, options='--enable-tvm-ffi')")
        if tensor is not None:
            out.append(tensor)
    return out


def _returned(value: Any, depth: int = 0) -> list[Any]:
    """The torch tensors in a call's outputs (a tensor, or tuples, lists and dicts of them; nothing else looked at)."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if depth > 4 or type(value) not in (tuple, list, dict):
        return []
    items = value.values() if type(value) is dict else value
    return [t for item in items for t in _returned(item, depth + 1)]


#: Above this many bytes of elements, an overlapping launch argument (whose distinct dimensions address the same
#: memory) is refused by the audit (`_audit_copy`).
EXPANDED_BYTES = 1 << 30


def _audit_copy(tensor: Any) -> Any:
    """The audit's copy of a launch argument: its values, in no more memory than the argument addresses.

    A dense copy of one byte expanded to 2^40 elements ran out of memory, which read as the machine's failure, so a
    file could void its own grading (`infra_error`) wherever the audit would have refused it (session 33's second
    red-teamer). An expanded view is copied as its distinct elements, expanded again (an honest broadcast of a
    shared weight stays cheap); an overlapping view above EXPANDED_BYTES is refused: a ValueError here is the gate's
    failure on the file's argument, `rule_violation`, never the machine's.
    """
    if tensor.is_contiguous():
        return tensor.detach().clone()
    own = _distinct(tensor)
    if own is None:
        if tensor.numel() * tensor.element_size() > EXPANDED_BYTES:
            raise ValueError(f"a launch argument of {tensor.numel() * tensor.element_size() / 2**30:.1f} GiB of "
                             "elements whose dimensions address the same memory (an overlapping view): the grader "
                             "copies launch arguments, so pass plain views")
        return tensor.detach().clone()
    if own.numel() < tensor.numel():
        return own.detach().clone().expand(tensor.shape)
    return tensor.detach().clone()


def _span(tensor: Any) -> tuple[int, int]:
    """The bytes a view addresses, first to last (for a contiguous view, exactly its elements)."""
    last = sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride(), strict=True) if size > 0)
    start = tensor.data_ptr()
    return start, start + (last + 1) * tensor.element_size()


#: Bytes of pad drawn at a time when the gate masks its saved copies (`LaunchGate._save`).
PAD_BYTES = 64 << 20


def _layout(regions: Any) -> list[tuple[int, int]]:
    return [(region.data_ptr(), region.numel()) for region in regions]


def _writable(tensor: Any) -> Any:
    """A launch argument as the ablations write it: its distinct elements (an expanded view cut to one each).

    An argument whose distinct dimensions overlap is refused: no fill or permutation is defined on it.
    """
    own = tensor if tensor.is_contiguous() else _distinct(tensor)
    if own is None:
        raise ValueError("a launch argument whose dimensions address the same elements (an overlapping as_strided "
                         "view): pass a plain view")
    return _alias(own)


def _alias(tensor: Any) -> Any:
    """The same elements as a new tensor of its own, for the gate to write through.

    Such writes move no version counter of the file's tensors (autograd's check of a saved tensor told isolated,
    randomised and suppressed calls apart: session 31's fifth red-teamer), and are allowed on inference tensors and
    on leaves that require grad (whose in-place errors left solve in ablated calls only).
    """
    import torch

    with torch.no_grad():
        return torch.empty(0, dtype=tensor.dtype, device=tensor.device).set_(
            tensor.untyped_storage(), tensor.storage_offset(), tensor.shape, tensor.stride())


def _distinct(tensor: Any) -> Any:
    """The elements a strided view addresses, each once: the view with its stride-0 dimensions cut to one.

    None where distinct dimensions still overlap (`as_strided` with strides shorter than the extents): copies of
    such a view could be far larger than the memory it addresses, and writing them back is not defined.
    """
    for dim, (size, stride) in enumerate(zip(tensor.shape, tensor.stride(), strict=True)):
        if stride == 0 and size > 1:
            tensor = tensor.narrow(dim, 0, 1)
    reach = 0  # the farthest element offset the dimensions of smaller stride reach
    for stride, size in sorted((st, sz) for sz, st in zip(tensor.shape, tensor.stride(), strict=True) if sz > 1):
        if stride <= reach:
            return None
        reach += (size - 1) * stride
    return tensor


def _outside(start: int, end: int, kept: list[tuple[int, int]]) -> Iterator[tuple[int, int]]:
    """The parts of [start, end) that no span of `kept` (sorted) covers."""
    at = start
    for lo, hi in kept:
        if hi <= at or lo >= end:
            continue
        if lo > at:
            yield at, lo
        at = max(at, hi)
    if at < end:
        yield at, end


def _stream(value: Any) -> bool:
    """A CUDA stream handed to a launch.

    The gate's copies and fills are queued on torch's current stream and would not be ordered with a launch on
    another (an answer written there could be copied before it lands).
    """
    return _of_kind(value, ("cuda.", "torch.cuda"), ("CUstream", "Stream", "ExternalStream"))


def _unreadable(value: Any) -> bool:
    """Device memory in a wrapper of a DSL's own (CuTe's runtime tensors and pointers, their subclasses too)."""
    return _of_kind(value, ("cutlass.cute", "cutlass.base_dsl"), ("Tensor", "Pointer"))


def _of_kind(value: Any, modules: tuple[str, ...], names: tuple[str, ...]) -> bool:
    """Whether `value`, or an item of a tuple or list of them, is of a class named in `names` from `modules`.

    The whole MRO is read: a subclass of the file's own does not hide it.
    """
    if isinstance(value, (tuple, list)):
        return any(_of_kind(item, modules, names) for item in value)
    return any(getattr(klass, "__module__", "").startswith(modules) and klass.__name__ in names
               for klass in type(value).__mro__)


#: The audit event an adapter raises when candidate code reaches for native host code (`DslAdapter.confine`); the
#: grading child's audit hook records it as a sandbox violation, which catching the exception does not undo.
NATIVE_CODE_EVENT = "metakernel.native_code"


#: A GPU clock named in a DSL's IR: the special registers (inline PTX, nvvm's sreg reads) and LLVM's counters. A
#: kernel that reads one can time itself and tell a row's first call (after the parent's pause) from the others;
#: no gold kernel does. The static rules refuse the names; the adapters' IR checks (`cute_host.device_problem`,
#: `tirx_host.source_problem`) see every spelling that ends in the module.
CLOCK_REGISTERS = re.compile(
    r"(?i)globaltimer|%clock|%pm\d|%gridid|sreg[._](?:clock|gridid)|readcyclecounter|readsteadycounter")

#: A GPU clock in generated CUDA C or PTX text: the registers above, CUDA's `clock` / `clock64` (called, through a
#: pointer or in parentheses) and libcu++'s chrono clocks; token pasting (`##`), a macro that stringifies (`#x`) and
#: the digraph `%:`, which build names and strings no text shows (session 26's red-teamers; no TVM source has them).
_SOURCE_CLOCKS = re.compile(CLOCK_REGISTERS.pattern + r"|(?<![\w$])clock(?:64)?(?![\w$])|chrono|##|%:"
                            r"|^[ \t]*#[ \t]*define\b[^\n]*[^\n#]#[ \t]*[A-Za-z_]", re.M)
#: What the C lexer sees first: raw strings, string and character literals (kept), comments (dropped).
_C_TOKENS = re.compile(r'R"([^()\\\s"]{0,16})\((.*?)\)\1"'  # a raw string
                       r'|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|/\*.*?\*/|//[^\n]*', re.S)
_C_JOIN = re.compile(r'"\s*"')  # adjacent string literals
_C_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{1,2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[0-7]{1,3})")


def _c_token(match: re.Match[str]) -> str:
    text = match.group(0)
    if text.startswith("/"):
        return " "  # a comment is one space to the compiler
    if match.group(2) is not None:
        return '"' + match.group(2) + '"'  # a raw string: its text, as an ordinary literal for the join below
    return text


def _c_escape(match: re.Match[str]) -> str:
    code = match.group(1)
    return chr(int(code[1:], 16) if code[0] in "xuU" else int(code, 8))


def source_clock(text: str) -> str | None:
    """The GPU clock a generated CUDA C (or PTX) source reads, or None: the last word on what a TIRx op emitted.

    Checking the IR op by op knows only the names it lists, and reads each string operand alone; the source the
    compiler gets is where every spelling ends. So the text is read as the C compiler's lexer will: line
    continuations dropped, comments dropped outside literals, raw strings taken as literals, adjacent literals
    joined (`"%%global" "timer"`), hex, octal and universal-character escapes decoded. What only the preprocessor
    would show (a token pasted from two halves) is refused as the paste itself; no TVM source holds one.
    """
    if found := CLOCK_REGISTERS.search(text):
        return found.group(0)
    code = _C_JOIN.sub("", _C_TOKENS.sub(_c_token, text.replace("\\\n", "")))
    if found := _SOURCE_CLOCKS.search(_C_ESCAPE.sub(_c_escape, code)):
        return found.group(0)
    return None


def ptx_problem(text: str) -> str | None:
    """Why compiled PTX may not run in a GPU grading (it reads a GPU clock), or None.

    The checks of each DSL's IR read each op and string alone; the PTX is where every spelling ends (asm variants
    and operands expanded, names finished, macros and intrinsics lowered), so the clock class does not depend on
    knowing every route to it. Both DSLs read their PTX with it (CuTe's compiles, TVM's CUDA compile callback).
    """
    clock = source_clock(text)
    if clock:
        return (f"device code reading a GPU clock ({clock.strip()} in the compiled PTX): kernels may not time "
                "themselves or tell calls apart")
    return None


def refuse_native_code(what: str) -> None:
    """Raise the audit event first (the child's hook records it and raises), then refuse in any case."""
    sys.audit(NATIVE_CODE_EVENT, what)
    raise PermissionError(f"the grader's sandbox refused {what}")


@runtime_checkable
class DslAdapter(Protocol):
    """A kernel DSL as the grader sees it."""

    key: str  # "cute" | "tirx": the variant name
    name: str  # human name, e.g. "CuTe DSL"
    import_roots: tuple[str, ...]  # top-level modules whose import means "the DSL is used" (static check)

    def environment(self, *, dry_run: bool) -> dict[str, str]:
        """Environment variables the child process needs before importing the DSL (arch, CUDA paths, caches)."""
        ...

    def import_dsl(self) -> None:
        """Import the DSL (seconds: done once per child, ahead of need)."""
        ...

    def install_hooks(self, gate: LaunchGate) -> None:
        """Patch the DSL's launch entry points so every kernel launch goes through `gate.should_launch()`.

        Must be idempotent and installed before the candidate module is imported. Compilation must still happen
        when a launch is suppressed or intercepted (the dry run exists to catch compile errors).
        """
        ...

    def confine(self) -> None:
        """Refuse the DSL's routes to native host code of the candidate's own.

        Called after `install_hooks` when the kernel is for the GPU, and in the free check: the candidate's process
        is reachable from such code below every Python-level layer, the timing clock included.
        """
        ...

    def clean_error(self, text: str) -> str:
        """Strip ANSI codes and DSL noise (NVRTC fp8-header warnings, MLIR dumps) from an error for an agent."""
        ...

    def resources(self) -> list[dict[str, Any]]:
        """In a dry run: what each kernel compiled since the last call asks of an SM (`KernelResources` rows)."""
        ...

    def guide(self) -> str:
        """Markdown for the prompt: how to write `solve` in this DSL for this harness, with a tiny example."""
        ...
