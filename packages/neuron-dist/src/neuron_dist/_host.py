"""Zero-copy CPU views of neuron tensors, the buffers gloo's transport reads and writes.

Neuron memory is host memory, so a CPU tensor over the same bytes lets gloo move device data
without a copy: what gloo writes into the view lands in the neuron tensor. A view does not own
its bytes; the collective that makes it keeps the neuron tensor alive until it completes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["host_view", "host_views", "host_view_lists"]

_CPU = torch.device("cpu")
_construct_storage = torch._C._construct_storage_from_data_pointer


def host_view(tensor: torch.Tensor) -> torch.Tensor:
    """A CPU tensor aliasing ``tensor``'s bytes (``tensor`` itself when it is already on the CPU)."""
    if tensor.device.type != "neuron":
        return tensor
    storage = tensor.untyped_storage()
    cpu_storage = _construct_storage(storage.data_ptr(), _CPU, storage.nbytes())
    return torch.empty((0,), dtype=tensor.dtype).set_(
        cpu_storage, tensor.storage_offset(), tensor.size(), tensor.stride()
    )


def host_views(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """:func:`host_view` of each tensor."""
    return [host_view(t) for t in tensors]


def host_view_lists(lists: Sequence[Sequence[torch.Tensor]]) -> list[list[torch.Tensor]]:
    """:func:`host_view` of each tensor of each list."""
    return [host_views(ts) for ts in lists]
