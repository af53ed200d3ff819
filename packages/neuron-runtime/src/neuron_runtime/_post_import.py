"""Post-import hooks: run a function on a module right after it has been executed.

The layers above the runtime patch other libraries (neuron-hf: transformers, accelerate, TRL,
PEFT; neuron-compile: a Dynamo internal) without importing them: ``import torch`` has to stay
cheap, and a user who never imports them pays nothing. Instead a finder sits first on
``sys.meta_path``; when one of the watched modules is imported it wraps that module's loader,
and the hook runs once the module body has executed, before the importer sees the module.
Modules that bind a patched name later (``from .utils import create_model_from_path``) then
bind the patched object.

A watched module can already be half-imported when the finder is installed (the module that
first imports torch, which runs the ``torch.backends`` entry points mid-import). Such modules
are kept pending and patched at the next import statement after they finish.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType

__all__ = ["install_finder", "register_post_import_hook"]

Hook = Callable[[ModuleType], None]

_hooks: dict[str, list[Hook]] = {}
_pending: set[str] = set()
_lock = threading.RLock()
_finder: _PostImportFinder | None = None


def _is_initialising(module: ModuleType) -> bool:
    spec = getattr(module, "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def _run_hooks(name: str, module: ModuleType) -> None:
    with _lock:
        hooks = _hooks.pop(name, [])
        _pending.discard(name)
    for hook in hooks:
        hook(module)


def _flush_pending() -> None:
    if not _pending:
        return
    with _lock:
        ready = [n for n in _pending if n in sys.modules and not _is_initialising(sys.modules[n])]
    for name in ready:
        _run_hooks(name, sys.modules[name])


class _PatchingLoader(importlib.abc.Loader):
    """Delegates to the real loader and runs the hooks after the module body executed."""

    def __init__(self, loader: importlib.abc.Loader, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _run_hooks(self._name, module)

    def __getattr__(self, attr: str) -> object:  # get_source, get_code, is_package, resource readers
        return getattr(self._loader, attr)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader another finder returns for a watched module."""

    def __init__(self) -> None:
        self._searching: set[str] = set()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        _flush_pending()
        if fullname not in _hooks or fullname in self._searching:
            return None
        self._searching.add(fullname)
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._searching.discard(fullname)
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec  # namespace packages and legacy loaders: leave them alone
        spec.loader = _PatchingLoader(spec.loader, fullname)
        return spec


def install_finder() -> None:
    """Puts the post-import finder first on ``sys.meta_path`` (idempotent)."""
    global _finder
    with _lock:
        if _finder is None:
            _finder = _PostImportFinder()
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)


def register_post_import_hook(module_name: str, hook: Hook) -> None:
    """Runs ``hook(module)`` once ``module_name`` has been imported (now, if it already is)."""
    module = sys.modules.get(module_name)
    with _lock:
        _hooks.setdefault(module_name, []).append(hook)
        if module is not None:
            _pending.add(module_name)
    if module is not None:
        _flush_pending()
