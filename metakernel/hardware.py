"""Ceilings for roofline shares. Vendor datasheet numbers for the H200 SXM (dense, no sparsity).

Measured here (shared/device/README.md, .library KINDS.md): ~4.3 TB/s copy bandwidth and ~790 TFLOP/s bf16 on
random data. We use the datasheet figures so roofline shares are comparable with published ones.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Gpu:
    """Peak rates of one GPU."""

    name: str
    bandwidth: float  # bytes/s
    peak_flops: dict[str, float]  # FLOP/s by operand precision

    def min_seconds(self, flops: int, nbytes: int, precision: str = "bf16") -> float:
        """The roofline lower bound: the slower of moving the bytes and doing the FLOPs."""
        return max(nbytes / self.bandwidth, flops / self.peak_flops[precision])


H200 = Gpu(name="NVIDIA H200", bandwidth=4.8e12,
           peak_flops={"bf16": 989e12, "fp16": 989e12, "fp8": 1979e12, "int8": 1979e12, "tf32": 494e12,
                       "fp32": 67e12})
