"""Which profiled GPU kernels are the DSL's, which are torch's or CUDA's libraries', and which are neither.

The DSL's kernels are recognised by exact symbol: the names the adapter read from what the DSL compiled in this
process (CuTe's `kernel_info`, the `__global__` symbols of TIRx's CUDA source), never by a substring, so an eager
kernel cannot borrow a DSL name. Library kernels show in a trace as demangled C++ (`void at::native::...<...>(...)`)
or under the vendor libraries' own prefixes (cuBLAS `nvjet_*`, `sm90_xmma_*`, cuDNN, copies and fills). A plain
C identifier that is neither is what another JIT produces (Triton, NVRTC through some route, jiterator): foreign.
"""

from __future__ import annotations

import re

LIBRARY_PREFIXES = ("nvjet", "sm90_", "sm80_", "sm86_", "sm89_", "sm75_", "sm70_", "cutlass", "ampere_", "volta_",
                    "turing_", "hopper_", "xmma", "gemv", "gemm", "cublas", "cudnn", "fmha", "flash", "Memcpy",
                    "Memset", "memcpy", "memset", "splitKreduce", "cub", "at_", "dgrad", "wgrad", "implicit")
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*$")


def classify(name: str, dsl_symbols: set[str]) -> str:
    """"dsl", "library" or "foreign"."""
    if name in dsl_symbols:
        return "dsl"
    if not _C_IDENTIFIER.match(name) or name.startswith(LIBRARY_PREFIXES):
        return "library"
    return "foreign"
