"""Registers the ``"neuron"`` backend with ``torch.distributed`` for the ``neuron`` device."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from neuron_dist import _dtensor_random
from neuron_dist._process_group import BACKEND_NAME, ProcessGroupNeuron

__all__ = ["register"]


def _create(options: Any, backend_options: Any = None) -> ProcessGroupNeuron:
    """Backend factory ``init_process_group`` and ``new_group`` call (extended API)."""
    _dtensor_random.install()  # DTensor is imported here, not at ``import torch``
    return ProcessGroupNeuron(
        options.store,
        options.group_rank,
        options.group_size,
        options.timeout,
        global_ranks=list(options.global_ranks_in_group),
    )


def register() -> None:
    """Makes ``init_process_group("neuron")`` create a :class:`ProcessGroupNeuron` (idempotent)."""
    if BACKEND_NAME in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=[BACKEND_NAME])
