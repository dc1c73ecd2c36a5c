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
