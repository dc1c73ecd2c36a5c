"""Grader pieces that only exist on a GPU (the IPC input arena): opt-in with --gpu, run on the H200."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu


def test_a_request_leaves_no_earlier_draw_in_the_input_arena(tmp_path: Path):
    """Hole 11: a one-draw request after a row must not leave the row's later draws (unmasked by the child by then)
    in the slots it does not use, nor an earlier draw's bytes under the gaps of the one it places."""
    from metakernel.grader.transport import mask_stream
    from metakernel.grader.worker import Worker

    kernel = tmp_path / "k.py"
    kernel.write_text("def solve(x):\n    return x\n")
    worker = Worker(kind="candidate", path=kernel, device="cuda", in_bytes=1 << 20, out_bytes=1 << 20, slots=4)
    try:
        worker._arenas()
        row = [[torch.randn(1 << 18, device="cuda") + 3.0] for _ in range(4)]  # 1 MB each, no zero byte likely
        views, _, _, masks = worker.place(row)
        assert all(m is not None for m in masks[1:]) and masks[0] is None
        assert torch.equal(views[0][0], row[0][0])
        start, end, key = masks[1]
        worker.arena_in[start:end].bitwise_xor_(mask_stream(end - start, key, "cuda"))  # the child's unmask
        assert torch.equal(views[1][0], row[1][0])
        small = [[torch.randn(100, device="cuda") + 3.0]]
        views, _, _, _ = worker.place(small)
        torch.cuda.synchronize()
        assert torch.equal(views[0][0], small[0][0])
        start = views[0][0].data_ptr() - worker.arena_in.data_ptr()  # its slot is drawn at random
        end = start + views[0][0].numel() * 4
        assert int(worker.arena_in[:start].count_nonzero()) == 0 and int(worker.arena_in[end:].count_nonzero()) == 0
        # a call's offset says nothing about which call it is: one-draw requests land in every slot
        offsets = {worker.place(small)[0][0][0].data_ptr() - worker.arena_in.data_ptr() for _ in range(40)}
        assert len(offsets) == 4, offsets
    finally:
        worker.close()


def test_the_gate_s_copies_leave_the_kernel_s_allocations_where_they_were():
    """A probe launch at the start of `solve` told an audited or randomised call from the others by where its next
    allocation landed (the gate's copies took the block it had just freed; session 22's red-teamer): the gate's
    tensors now come from a private pool, so the kernel's allocator state is the same in every mode."""
    from metakernel.dsl.base import LaunchGate

    size = 36 << 20
    src = torch.randn(size // 4, device="cuda")
    seen = {}
    for mode in ("run", "audit", "randomize", "suppress"):
        gate = LaunchGate(mode="suppress" if mode == "suppress" else "run", audit=mode == "audit",
                          randomize=mode == "randomize", pool=torch.cuda.MemPool())
        freed = torch.empty(size, dtype=torch.uint8, device="cuda")
        address = freed.data_ptr()
        del freed
        gate.should_launch((src,), {}, ("probe",))
        gate.after_launch()
        again = torch.empty(size, dtype=torch.uint8, device="cuda")
        seen[mode] = again.data_ptr() == address
        del again, gate
    assert all(seen.values()), seen


def test_isolation_covers_the_allocator_and_keeps_the_gate_s_copies():
    """Hole 12 on the device: the child offers every caching-allocator block (live and free) and the input arena to
    the isolation ablation, but not the gate's private pool, where the copies of live bytes go: a copy landing in a
    block about to be filled would restore noise. An eager answer beside a one-element anchor reads as noise while
    the launch runs; live memory has its bytes back after it; the kernel's own arguments are never touched."""
    from types import SimpleNamespace

    from metakernel.dsl.base import LaunchGate
    from metakernel.grader.child import Bound, Child

    block = torch.randn(1 << 20, device="cuda")
    anchor, answer = block[:1], block[1 << 19:]
    arena = torch.randn(1 << 18, device="cuda").view(torch.uint8)
    out = torch.zeros(1 << 19, device="cuda")
    saved, arena_before = block.cpu(), arena.cpu()  # (every CUDA block but the gate's pool is noise during a launch)
    gone = torch.randn(1 << 20, device="cuda") + 5.0
    gone_at, gone_values = gone.data_ptr(), gone.cpu()
    del gone  # a freed answer keeps its bytes until the allocator hands the block out again
    gate = LaunchGate(mode="run", isolate=True, pool=torch.cuda.MemPool())
    child = SimpleNamespace(gate=gate, arena_in=arena, device="cuda", torch=torch, b=Bound(torch, "cuda"))
    gate.reachable = lambda: Child._reachable(child)  # type: ignore[arg-type]
    assert gate.should_launch((anchor, out))
    assert gate.isolated > block.nbytes
    torch.cuda.synchronize()
    assert torch.equal(anchor.cpu(), saved[:1]) and int((answer.cpu() == saved[1 << 19:]).sum()) < 64
    assert not torch.equal(arena.cpu(), arena_before)
    from metakernel.grader.transport import wrap_device_bytes

    freed = wrap_device_bytes(gone_at, 1 << 22).view(torch.float32)
    assert int((freed.cpu() == gone_values).sum()) < 64  # the free block: noise
    out.copy_(answer)  # the "kernel"
    gate.after_launch()
    torch.cuda.synchronize()
    assert torch.equal(block.cpu(), saved) and torch.equal(arena.cpu(), arena_before)
    assert torch.equal(freed.cpu(), gone_values)  # the free block's stale bytes too: nothing after it tells
    assert not torch.allclose(out.cpu(), saved[1 << 19:])


def test_a_non_blocking_copy_to_the_cpu_shows_as_page_locked_memory():
    """The child's `_pinned` reads torch's host allocator: a non_blocking copy to the CPU (its flag positional,
    under no refused name) hands out page-locked memory the GPU can read by address, and the isolation's verdict
    rests on seeing it."""
    from types import SimpleNamespace

    from metakernel.grader.child import Bound, Child

    child = SimpleNamespace(b=Bound(torch, "cuda"), pinned_base=0)
    child._pinned_now = lambda: Child._pinned_now(child)  # type: ignore[arg-type]
    child.pinned_base = child._pinned_now()
    assert Child._pinned(child) == 0  # type: ignore[arg-type]
    held = torch.randn(1 << 20, device="cuda").to(torch.device("cpu"), torch.float32, True)
    torch.cuda.synchronize()
    assert Child._pinned(child) >= held.nbytes  # type: ignore[arg-type]
    del held  # freed, the block stays cached, page-locked and mapped with its bytes: still counted
    for _ in range(2):
        torch.ones(1, device="cuda").item()
    assert Child._pinned(child) >= 4 << 20  # type: ignore[arg-type]


def test_a_caught_out_of_memory_error_is_counted_as_the_file_s():
    """A failed 1 PiB request makes the caching allocator release its cached segments (empty_cache under no
    refused name); the child counts such errors (`Child._ooms`), less the gate's own."""
    from types import SimpleNamespace

    from metakernel.dsl.base import LaunchGate
    from metakernel.grader.child import Bound, Child

    b = Bound(torch, "cuda")
    child = SimpleNamespace(b=b, gate=LaunchGate(mode="run"), oom_base=int(b.memory_stats().get("num_ooms", 0)))
    assert Child._ooms(child) == 0  # type: ignore[arg-type]
    try:
        torch.empty(1 << 50, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError:
        pass
    assert Child._ooms(child) == 1  # type: ignore[arg-type]
    child.gate.own_ooms = 1
    assert Child._ooms(child) == 0  # type: ignore[arg-type]


def test_the_allocator_s_own_account_of_a_failed_request_reaches_the_child():
    """What the parent judges an out-of-memory failure by (`Evaluation.end`): the request and the bytes held, from
    the caching allocator's observer, not from the message."""
    from types import SimpleNamespace

    from metakernel.grader.child import Child

    child = SimpleNamespace(oom_seen=[])
    torch._C._cuda_attach_out_of_memory_observer(lambda *a: Child._out_of_memory(child, *a))  # type: ignore[arg-type]
    held = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    try:
        torch.empty(1 << 50, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError:
        pass
    assert child.oom_seen and child.oom_seen[-1][0] >= 1 << 50 and child.oom_seen[-1][1] >= held.nbytes


def test_the_driver_reports_a_process_s_gpu_memory_through_every_allocator():
    """`tree_gpu_bytes`: what the grader credits a kernel's process with when the card ran full (NVML)."""
    import subprocess
    import sys

    from metakernel.grader.evaluate import tree_gpu_bytes

    code = ("import time, torch; x = torch.empty(1 << 30, dtype=torch.uint8, device='cuda'); x.fill_(1); "
            "torch.cuda.synchronize(); print('held', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        used = tree_gpu_bytes(proc.pid)
        assert used is not None and used >= 1 << 30, used
    finally:
        proc.kill()
        proc.wait()


_AFTER_WARMUP = '''
import ctypes, sys, torch
from metakernel.grader import sandbox
torch.cuda.init(); torch.empty(1, device="cuda")  # the warm-up the child does before its late filter
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(sandbox.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
refused = dict(sandbox.REFUSED_AFTER_WARMUP_X86_64) | (sandbox.REFUSED_WITHOUT_CUDA_X86_64 if sys.argv[1] == "memfd"
                                                         else {})
sandbox._install_syscall_filter(libc, sandbox.seccomp_program(refused, clones=False,
                                                              socket_families=sandbox.REFUSED_SOCKET_FAMILIES))
a = torch.randn(512, 512, device="cuda")
b = (a @ a).relu().sum()  # cuBLAS's handle and lazily loaded modules, after the filter
code = "template <typename T> T twice(T x) { return x * 2; }"
jit = torch.cuda.jiterator._create_jit_fn(code)  # NVRTC and a module load, as TVM's route does
c = jit(a)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:  # CUPTI, first use here
    d = (c * 3).sum()
torch.cuda.synchronize()
pinned = torch.empty(1 << 20, pin_memory=True)
pinned.copy_(a.flatten()[: 1 << 20].cpu())
print("ok", float(b) == float(b), float(d) == float(d), len(prof.key_averages()) > 0)
'''


@pytest.mark.parametrize("refused", ["queues", "memfd"])
def test_cuda_runs_after_the_late_filter(refused: str, tmp_path: Path):
    """What the child's late filter refuses leaves CUDA working: cuBLAS, lazy module loads, NVRTC, CUPTI, pinned
    memory after it. "memfd" is the open question of session 35 (the driver makes a memfd at its start; CUDA
    children keep `memfd_create` until this passes on a GPU: then move REFUSED_WITHOUT_CUDA_X86_64 into
    REFUSED_AFTER_WARMUP_X86_64)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _AFTER_WARMUP, refused], capture_output=True, text=True, timeout=300,
                          cwd=str(Path(__file__).resolve().parents[1]))
    assert done.returncode == 0 and done.stdout.strip() == "ok True True True", done.stdout + done.stderr[-3000:]
