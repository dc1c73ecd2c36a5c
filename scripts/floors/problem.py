"""The launch floor: the least work a call can do, y = x + 1 on 1024 fp32 values (one CTA's worth).

Not a benchmark problem: `scripts/bench_overhead.py --floors` times each DSL's launch routes on it with the
grader's bracket, so a reader sees how much of a small kernel's end-to-end time the launch route alone costs.
"""
import torch

N = 1024


def reference(x):
    return x + 1.0


def make_inputs(device="cuda", scale="full"):
    return [torch.randn(N, device=device)]
