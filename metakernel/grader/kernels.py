"""Which profiled GPU kernels are the DSL's, which are torch's or CUDA's libraries', and which are neither.

The DSL's kernels are recognised by exact symbol: the names the adapter read from what the DSL compiled in this
process (CuTe's `kernel_info`, the `__global__` symbols of TIRx's CUDA source), never by a substring, so an eager
kernel cannot borrow a DSL name. Library kernels show in a trace as demangled C++ (`void at::native::...<...>(...)`)
or under the vendor libraries' own prefixes (cuBLAS `nvjet_*`, `sm90_xmma_*`, cuDNN, copies and fills). A plain
C identifier that is neither is what another JIT produces (Triton, NVRTC through some route, jiterator): foreign.
"""

from __future__ import annotations

import re

#: cuBLAS's own kernels carry plain C names under these prefixes (nvjet_*, sm90_xmma_*, cutlass3x_*); torch's are
#: demangled C++. Kept short on purpose: every prefix here is a name a foreign JIT could borrow.
LIBRARY_PREFIXES = ("nvjet", "cutlass", "Memcpy", "Memset", "memcpy", "memset")
_VENDOR_ARCH = re.compile(r"^sm\d{2,3}_")
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*$")


def classify(name: str, dsl_symbols: set[str]) -> str:
    """"dsl", "library" or "foreign"."""
    if name in dsl_symbols:
        return "dsl"
    if not _C_IDENTIFIER.match(name) or vendor_named(name):
        return "library"
    return "foreign"


def is_symbol(name: str) -> bool:
    """Whether a name can be a DSL kernel's symbol.

    Both DSLs' kernels are plain C identifiers (C linkage), so a demangled C++ name among the DSL's symbols was put
    there to count a library's kernel as DSL work.
    """
    return bool(_C_IDENTIFIER.match(name))


def vendor_named(name: str) -> bool:
    """Whether a plain C name carries a vendor library's prefix: one the DSL's own kernels may not carry.

    A DSL symbol named like cuBLAS's kernels makes the library's kernel of that name count as DSL work (session
    24's red-teamer declared `nvjet_*` names in TIRx's generated source). (Demangled C++ names cannot be a DSL
    symbol: both DSLs' kernels are plain C identifiers.)
    """
    return name.startswith(LIBRARY_PREFIXES) or bool(_VENDOR_ARCH.match(name))


_CUTE_FUNCTION = re.compile(r"kernel_cutlass_(.+?)_(?:tensor|ptr|FakeTensor|Int|Float|Bool|Constexpr)")


def function_of(symbol: str) -> str:
    """The DSL function a device symbol was compiled from.

    CuTe spells each specialisation's argument types and layouts into the symbol (`kernel_cutlass_<fn>_tensorptr...`),
    so one function compiled for two shapes has two symbols; TIRx's symbols are the function's own name. Comparing
    functions, not symbols, keeps a kernel that meets a new shape in a later draw from looking like new code.
    """
    match = _CUTE_FUNCTION.match(symbol)
    return match.group(1) if match else symbol
