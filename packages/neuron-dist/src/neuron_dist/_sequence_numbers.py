"""``ProcessGroup._get_sequence_number_for_group`` on neuron groups.

torch's ``ProcessGroup`` forwards the group-level sequence-number calls to its backend only for
gloo, NCCL, XCCL and UCC, and raises "ProcessGroup custom does not yet support sequence numbers"
for every backend registered by a plugin, although the neuron backend numbers its collectives
as gloo does (the number PyTorch's tests and debugging tools read). For groups whose neuron
tensors go to the neuron backend, the group-level calls read and set the neuron backend's
number; every other group keeps torch's behaviour.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from neuron_dist._groups import serves_neuron
from neuron_dist._process_group import BACKEND_NAME

__all__ = ["install"]

_PATCHED = "_neuron_sequence_numbers"


def _forwarded(original: Callable[..., Any], name: str) -> Callable[..., Any]:
    @functools.wraps(original)
    def call(group: dist.ProcessGroup, *args: Any) -> Any:
        try:
            return original(group, *args)
        except RuntimeError as error:
            if "does not yet support sequence numbers" not in str(error) or not serves_neuron(group):
                raise
        return getattr(group._get_backend(torch.device(BACKEND_NAME)), name)(*args)

    setattr(call, _PATCHED, True)
    return call


def install() -> None:
    """Wraps the group-level sequence-number methods of ``torch.distributed.ProcessGroup`` (idempotent)."""
    for name in ("_get_sequence_number_for_group", "_set_sequence_number_for_group"):
        original = getattr(dist.ProcessGroup, name)
        if not getattr(original, _PATCHED, False):
            setattr(dist.ProcessGroup, name, _forwarded(original, name))
