"""Kernel DSL adapters: one module per DSL behind `metakernel.dsl.base.DslAdapter`."""
