"""The check's resource table: occupancy arithmetic for an H200 SM and the text an agent reads (the cubin parser
itself is exercised on every gold kernel's real sm_90a cubins by tests/test_solutions_dry_run.py)."""

from __future__ import annotations

from metakernel.dsl.resources import KernelResources, occupancy, table


def test_occupancy_is_bounded_by_whichever_sm_resource_runs_out_first():
    # 115 registers: 15 * 256 per warp, 17 warps of 64 fit, two 8-warp blocks: 25 %
    k = occupancy(KernelResources("gemm", 115, 0, 1024, 256))
    assert (k.blocks_per_sm, k.limited_by, k.occupancy) == (2, "registers", 0.25)
    # 24 registers, 128 threads: 16 blocks of 4 warps fill the 64 warps
    k = occupancy(KernelResources("ew", 24, 0, 0, 128))
    assert (k.blocks_per_sm, k.limited_by, k.occupancy) == (16, "threads", 1.0)
    # 100 KB of static shared memory: two blocks (plus 1 KB reserved each) in 228 KB
    k = occupancy(KernelResources("tile", 32, 0, 100 * 1024, 128))
    assert (k.blocks_per_sm, k.limited_by) == (2, "shared memory")
    # 32 threads, few registers: the 32-blocks-per-SM cap
    k = occupancy(KernelResources("tiny", 16, 0, 0, 32))
    assert (k.blocks_per_sm, k.limited_by, k.occupancy) == (32, "blocks", 0.5)
    # block size not fixed at compile time: nothing claimed
    k = occupancy(KernelResources("dyn", 40, 0, 0, None))
    assert k.blocks_per_sm is None and k.occupancy is None


def test_table_names_kernels_by_function_and_flags_local_memory():
    rows = [occupancy(KernelResources("kernel_cutlass__gemm_kernel_tensorptrbf16gmemalign16o40961_0", 115, 0, 0,
                                      256)).as_dict(),
            occupancy(KernelResources("softmax_kernel", 255, 96, 0, None)).as_dict()]
    text = table(rows)
    assert "_gemm_kernel " in text and "tensorptr" not in text
    assert "block size not fixed at compile time" in text
    assert "register spills or local arrays" in text  # stack > 0 is called out
    assert "dynamic shared memory is set at launch and not counted" in text
    assert table([]) == ""
