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
# Recent views by (address of the first element, dtype, shape, strides). A view is only handed out
# for a live tensor with exactly that geometry, so it aliases that tensor's bytes even if the memory
# it was first made for has been freed and reused since. Collectives call with the same buffers over
# and over (gradient buckets, benchmark loops), and making a view costs ~10x a lookup.
_VIEWS: dict[tuple, torch.Tensor] = {}
_MAX_VIEWS = 512


def host_view(tensor: torch.Tensor) -> torch.Tensor:
    """A CPU tensor aliasing ``tensor``'s bytes (``tensor`` itself when it is already on the CPU)."""
    if tensor.is_cpu:
        return tensor
    key = (tensor.data_ptr(), tensor.dtype, tensor.shape, tensor.stride())
    view = _VIEWS.get(key)
    if view is not None:
        return view
    if tensor.device.type != "neuron":
        return tensor
    storage = tensor.untyped_storage()
    cpu_storage = _construct_storage(storage.data_ptr(), _CPU, storage.nbytes())
    # Never an inference tensor: a view made for a collective under torch.inference_mode() may
    # serve a later one outside it, which must be able to write through it.
    with torch.inference_mode(False):
        view = torch.empty((0,), dtype=tensor.dtype, device="cpu").set_(
            cpu_storage, tensor.storage_offset(), tensor.size(), tensor.stride()
        )
    if len(_VIEWS) >= _MAX_VIEWS:
        _VIEWS.clear()
    _VIEWS[key] = view
    return view


def host_views(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """:func:`host_view` of each tensor."""
    return [host_view(t) for t in tensors]


def host_view_lists(lists: Sequence[Sequence[torch.Tensor]]) -> list[list[torch.Tensor]]:
    """:func:`host_view` of each tensor of each list."""
    return [host_views(ts) for ts in lists]
