"""Subgroups on another backend than the neuron-bound default group, e.g. ``new_group(backend="gloo")``.

``init_process_group("neuron", device_id=torch.device("neuron", i))`` binds the default group to
a core, and every later ``new_group`` inherits that binding. torch then asks the new group's
backend for the bound device; a gloo group has none for neuron, so ``new_group(backend="gloo")``
(CPU-side groups, as ``torch.distributed.checkpoint.async_save`` creates) failed with
``No backend type associated with device type neuron``. With CUDA the same call works because
gloo also serves CUDA tensors. A group whose backend does not serve the bound device's type is
now created unbound, as it would be without ``device_id``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.distributed import distributed_c10d

__all__ = ["install"]

_PATCHED = "_neuron_unbinds_foreign_devices"


def _serves(backend: Any, device: torch.device) -> bool:
    try:
        config = distributed_c10d.BackendConfig(distributed_c10d.Backend(backend))
    except (ValueError, RuntimeError):
        return True  # let torch report the problem with the backend itself
    return device.type in config.get_device_backend_map()


def _unbinding_foreign_devices(helper: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(helper)
    def new_process_group_helper(*args: Any, **kwargs: Any) -> Any:
        device_id = kwargs.get("device_id")
        backend = kwargs.get("backend", args[3] if len(args) > 3 else None)
        if isinstance(device_id, torch.device) and backend is not None and not _serves(backend, device_id):
            kwargs["device_id"] = None
        return helper(*args, **kwargs)

    setattr(new_process_group_helper, _PATCHED, True)
    return new_process_group_helper


def install() -> None:
    """Wraps torch's process-group factory (idempotent)."""
    if getattr(distributed_c10d._new_process_group_helper, _PATCHED, False):
        return
    distributed_c10d._new_process_group_helper = _unbinding_foreign_devices(
        distributed_c10d._new_process_group_helper
    )
