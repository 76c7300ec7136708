"""Traces of any callable, not only this project's layers: ``dispatch`` runs the callable
once under a ``TorchDispatchMode`` and records every aten op it dispatches;
``aten_registry`` classifies each op as a view, a kernel of a ``costmodel.families``
family, or unmapped.

Imports ``costmodel`` only.
"""
