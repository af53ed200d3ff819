"""``init_process_group()`` without a backend on a neuron machine uses the ``"neuron"`` backend.

torch resolves a missing backend from the device only when ``device_id`` is given; without it
the group's backend is ``"undefined"`` and its default backend type is set to gloo whatever the
accelerator, so on a third-party device the group had a neuron backend but claimed gloo: DDP
failed (``Could not find backend type 1 for Process Group with name gloo``) and
``get_backend()`` said ``"undefined"``. With CUDA the same call gives NCCL; with neuron it now
gives ``"neuron"``, as ``init_process_group(device_id=torch.device("neuron", i))`` already did.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from neuron_dist._process_group import BACKEND_NAME

__all__ = ["install"]

_PATCHED = "_neuron_default_backend"


def _accelerator_is_neuron() -> bool:
    accelerator = torch.accelerator.current_accelerator()
    return accelerator is not None and accelerator.type == BACKEND_NAME


def _with_neuron_default(init: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(init)
    def init_process_group(backend: str | None = None, *args: Any, **kwargs: Any) -> Any:
        if backend is None and kwargs.get("device_id") is None and _accelerator_is_neuron():
            backend = BACKEND_NAME
        return init(backend, *args, **kwargs)

    setattr(init_process_group, _PATCHED, True)
    return init_process_group


def install() -> None:
    """Wraps ``torch.distributed.init_process_group`` (idempotent)."""
    if getattr(distributed_c10d.init_process_group, _PATCHED, False):
        return
    patched = _with_neuron_default(distributed_c10d.init_process_group)
    distributed_c10d.init_process_group = patched
    dist.init_process_group = patched
