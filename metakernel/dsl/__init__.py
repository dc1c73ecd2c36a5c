"""Kernel DSL adapters: one module per DSL behind `metakernel.dsl.base.DslAdapter`."""

from __future__ import annotations

import importlib

from metakernel.dsl.base import DslAdapter, LaunchGate

DSL_MODULES = {"cute": "metakernel.dsl.cute", "tirx": "metakernel.dsl.tirx"}


def get_adapter(key: str) -> DslAdapter:
    """The adapter for a variant key ("cute" or "tirx"); importing it does not import the DSL itself."""
    if key not in DSL_MODULES:
        raise KeyError(f"unknown DSL {key!r} (known: {', '.join(DSL_MODULES)})")
    return importlib.import_module(DSL_MODULES[key]).ADAPTER


__all__ = ["DSL_MODULES", "DslAdapter", "LaunchGate", "get_adapter"]
