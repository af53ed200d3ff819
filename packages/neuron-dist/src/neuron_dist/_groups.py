"""Which process groups this backend serves, however the user named it."""

from __future__ import annotations

from typing import Any

import torch

from neuron_dist import _C
from neuron_dist._process_group import BACKEND_NAME

__all__ = ["serves_neuron"]


def serves_neuron(group: Any) -> bool:
    """Whether ``group``'s neuron tensors go to the neuron backend (``init_process_group("neuron")``,
    ``"cpu:gloo,neuron:neuron"``, or no backend at all on a neuron machine)."""
    try:
        backend = group._get_backend(torch.device(BACKEND_NAME))
    except (RuntimeError, ValueError, AttributeError):
        return False
    # TORCH_DISTRIBUTED_DEBUG=DETAIL wraps every backend in torch's _ProcessGroupWrapper
    backend = getattr(backend, "wrapped_pg", backend)
    return isinstance(backend, _C.PythonBackend)
