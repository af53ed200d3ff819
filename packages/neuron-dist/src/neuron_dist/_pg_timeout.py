"""torch.distributed's ``_set_pg_timeout`` on neuron groups.

torch's ``_set_pg_timeout`` (torchtitan shortens the timeout with it once the first step has
compiled and warmed up) changes the timeout of gloo, NCCL and XCCL backends only, and otherwise
warns "Set timeout is now only supported for either nccl or gloo" and changes nothing. For
groups whose neuron tensors go to the neuron backend it sets the timeout of every backend of the
group (``ProcessGroup.set_timeout``, which the neuron backend implements); other groups keep
torch's rule.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from torch.distributed import distributed_c10d as c10d

from neuron_dist._groups import serves_neuron

__all__ = ["install"]

_PATCHED = "_neuron_set_pg_timeout"


def _on_neuron(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _set_pg_timeout(timeout: timedelta, group: Any = None) -> None:
        group_to_use = c10d._get_default_group() if group is None else group
        if c10d._rank_not_in_group(group_to_use) or not serves_neuron(group_to_use):
            return original(timeout, group)
        group_to_use.set_timeout(timeout)
        return None

    setattr(_set_pg_timeout, _PATCHED, True)
    return _set_pg_timeout


def install() -> None:
    """Wraps ``torch.distributed.distributed_c10d._set_pg_timeout`` (idempotent)."""
    if getattr(c10d._set_pg_timeout, _PATCHED, False):
        return
    c10d._set_pg_timeout = _on_neuron(c10d._set_pg_timeout)
