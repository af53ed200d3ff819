"""``torch.distributed.monitored_barrier`` on neuron groups.

torch refuses every backend but gloo before it calls the group (``monitored_barrier is only
implemented for GLOO backend``), although the call goes to the backend like any other. The
neuron backend, built on gloo's transport, implements it (ranks that do not arrive within the
timeout are named), so for groups it serves the check is skipped; other groups keep torch's rule.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from neuron_dist._groups import serves_neuron

__all__ = ["install"]

_PATCHED = "_neuron_monitored_barrier"


def _on_neuron(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def monitored_barrier(group: Any = c10d.GroupMember.WORLD, timeout: Any = None, wait_all_ranks: bool = False) -> Any:
        group_to_use = c10d._get_default_group() if group is None else group
        if c10d._rank_not_in_group(group) or not serves_neuron(group_to_use):
            return original(group, timeout, wait_all_ranks)
        if timeout is None:
            timeout = c10d._get_default_timeout(c10d.get_backend(group))
        elif isinstance(timeout, float):
            warnings.warn("Please specify timeout arg as a timedelta. Converting current value of "
                          f"{timeout} assuming it represents seconds", stacklevel=2)
            timeout = timedelta(seconds=timeout)
        c10d._check_valid_timeout(timeout)
        return group_to_use.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)

    setattr(monitored_barrier, _PATCHED, True)
    return monitored_barrier


def install() -> None:
    """Wraps ``torch.distributed.monitored_barrier`` (idempotent)."""
    if getattr(c10d.monitored_barrier, _PATCHED, False):
        return
    patched = _on_neuron(c10d.monitored_barrier)
    c10d.monitored_barrier = patched
    dist.monitored_barrier = patched
