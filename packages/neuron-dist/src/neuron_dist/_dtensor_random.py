"""DTensor's random ops on ``neuron`` meshes: each rank's own generator, as on CPU meshes.

DTensor coordinates random ops across ranks only on devices whose generator is a Philox
(seed, offset) pair, as CUDA's is: it rewrites the offset of the state before each op. It
recognises such devices by their having ``set_rng_state``, which ``torch.neuron`` has for the
checkpointing code of accelerate and transformers; but the emulated device's generator is
the CPU's Mersenne Twister (equal seeds give the CPU's stream), whose 5056-byte state DTensor
cannot rewrite: every random op on a neuron DTensor (``nn.init`` of FSDP2 or TP parameters,
dropout on sharded activations) failed with an AssertionError inside DTensor.

Neuron meshes therefore take DTensor's path for CPU meshes: a random op on a DTensor runs on
each rank's local shard with that rank's generator (seed ranks as the program needs: equal
seeds give equal draws on every shard). As for CPU meshes, DTensor's own
``manual_seed(seed, mesh)`` warns and seeds nothing: seed with ``torch.manual_seed``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from types import ModuleType
from typing import Any

__all__ = ["install", "install_when_imported"]

_RANDOM = "torch.distributed.tensor._random"
_DISPATCH = "torch.distributed.tensor._dispatch"
_lock = threading.Lock()
_installed = False


def install() -> None:
    """Makes DTensor treat neuron meshes like CPU meshes for random ops (idempotent)."""
    from torch.distributed.tensor import _random

    _patch(_random)


def _patch(random_module: ModuleType) -> None:
    global _installed
    with _lock:
        if _installed:
            return
        upstream = random_module.is_rng_supported_mesh

        def is_rng_supported_mesh(device_mesh: Any) -> bool:
            if getattr(device_mesh, "device_type", None) == "neuron":
                return False
            return upstream(device_mesh)

        is_rng_supported_mesh.__doc__ = upstream.__doc__
        is_rng_supported_mesh.__wrapped__ = upstream  # type: ignore[attr-defined]
        # _api and manual_seed read the module attribute; _dispatch imports the name (after this
        # module has run, so it gets the patched one, unless it was imported before install()).
        random_module.is_rng_supported_mesh = is_rng_supported_mesh
        dispatch = sys.modules.get(_DISPATCH)
        if dispatch is not None and getattr(dispatch, "is_rng_supported_mesh", None) is upstream:
            dispatch.is_rng_supported_mesh = is_rng_supported_mesh
        _installed = True


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Patches DTensor's random module as soon as it has been imported, whatever imports it."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != _RANDOM:
            return None
        _remove_finder()
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_patch(module: ModuleType) -> None:
            exec_module(module)
            _patch(module)

        spec.loader.exec_module = exec_then_patch  # type: ignore[method-assign]
        return spec


def _remove_finder() -> None:
    sys.meta_path[:] = [finder for finder in sys.meta_path if not isinstance(finder, _PatchAfterImport)]


def install_when_imported() -> None:
    """:func:`install` now if DTensor is loaded, else as soon as it is: DTensor random ops on a
    neuron mesh must work whichever process group made the mesh (PyTorch's threaded test group
    too), and importing DTensor at ``import torch`` would cost every program half a second."""
    if _RANDOM in sys.modules:
        _patch(sys.modules[_RANDOM])
    elif not any(isinstance(finder, _PatchAfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PatchAfterImport())
