"""Patching a torch module as soon as it is imported, without importing it ourselves.

Some of torch's modules need a neuron adjustment but cost time to import (DTensor's random
module, DDP's ZeRO hooks); importing them at ``import torch`` would slow every program. A
finder on ``sys.meta_path`` runs the patch right after the module's own code, whatever imports
it, or at once if it is already loaded.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

__all__ = ["when_imported"]


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Runs ``patch(module)`` right after the module ``name`` has been executed."""

    def __init__(self, name: str, patch: Callable[[ModuleType], None]) -> None:
        self.name = name
        self._patch = patch

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != self.name:
            return None
        sys.meta_path[:] = [finder for finder in sys.meta_path if finder is not self]
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module
        patch = self._patch

        def exec_then_patch(module: ModuleType) -> None:
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_then_patch  # type: ignore[method-assign]
        return spec


def when_imported(name: str, patch: Callable[[ModuleType], None]) -> None:
    """``patch(module)`` now if module ``name`` is loaded, else as soon as it is (idempotent per name)."""
    if name in sys.modules:
        patch(sys.modules[name])
    elif not any(isinstance(f, _PatchAfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchAfterImport(name, patch))
