"""The bottom layer: errors, argument checks, pytrees with JAX's semantics, column primitives
(object columns, ``DeferredTake``, ``StringColumn``), file identities, interrupt-safe cleanup, plain
stats records. It imports nothing else of jaxloader (docs/architecture.md has the layers).
"""
