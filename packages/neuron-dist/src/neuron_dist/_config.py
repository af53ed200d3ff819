"""neuron-dist's settings from the environment, read once.

``NEURON_DIST_CHECK_SIGNATURES`` (default ``1``): exchange collective signatures before data
moves, so mismatched calls raise :class:`CollectiveMismatchError` on every rank. ``0`` skips the
exchange (one small all-gather less per collective); mismatches then abort the process inside
gloo, or mix data of equal-width dtypes, as plain gloo does.

``NEURON_DIST_INLINE_BYTES`` (default ``8388608``, 8 MiB): with the check on, all_reduce,
all_gather_into_tensor and reduce_scatter_tensor whose data fits travel inside the signature
exchange (:mod:`neuron_dist._frames`), so they cost one all-gather instead of two collectives.
The limit is on the bytes one exchange gathers (all ranks' frames together); ``0`` never inlines.

``NEURON_DIST_SPECULATE`` (default ``1``): with the check on, post a large all_reduce,
all_gather_into_tensor or reduce_scatter_tensor together with its signature exchange when the
group predicts it from the collectives before (:mod:`neuron_dist._speculation`), so a repeating
pattern costs one round trip per collective. ``0`` waits for the exchange before moving data.

All three decide which gloo operations a rank posts, so every rank of a group must use the same
values: a group compares them through its store when it is created (:func:`agree`) and refuses
to start otherwise (different values would abort the process inside gloo at the first collective).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch.distributed as dist

__all__ = ["DistConfig", "agree", "config"]


@dataclass(frozen=True)
class DistConfig:
    check_signatures: bool
    inline_bytes: int
    speculate: bool


def _load() -> DistConfig:
    value = os.environ.get("NEURON_DIST_CHECK_SIGNATURES", "1").strip()
    if value not in ("0", "1"):
        raise ValueError(f"NEURON_DIST_CHECK_SIGNATURES must be 0 or 1, got {value!r}")
    inline = os.environ.get("NEURON_DIST_INLINE_BYTES", str(8 << 20)).strip()
    if not inline.isdigit():
        raise ValueError(f"NEURON_DIST_INLINE_BYTES must be a number of bytes >= 0, got {inline!r}")
    speculate = os.environ.get("NEURON_DIST_SPECULATE", "1").strip()
    if speculate not in ("0", "1"):
        raise ValueError(f"NEURON_DIST_SPECULATE must be 0 or 1, got {speculate!r}")
    return DistConfig(check_signatures=value == "1", inline_bytes=int(inline), speculate=speculate == "1")


config = _load()

_SETTINGS_KEY = "neuron_dist_settings/{rank}"


def _describe(settings: DistConfig) -> str:
    return (f"NEURON_DIST_CHECK_SIGNATURES={int(settings.check_signatures)} "
            f"NEURON_DIST_INLINE_BYTES={settings.inline_bytes} NEURON_DIST_SPECULATE={int(settings.speculate)}")


def agree(store: dist.Store, rank: int, size: int, global_ranks: list[int], settings: DistConfig = config) -> None:
    """Raises ``ValueError`` on every rank of a new group unless all of them have the same settings.

    ``store`` is the group's own (prefixed) store; every rank of the group is creating it now.
    """
    mine = _describe(settings)
    store.set(_SETTINGS_KEY.format(rank=rank), mine)
    theirs = [mine if r == rank else store.get(_SETTINGS_KEY.format(rank=r)).decode() for r in range(size)]
    if all(other == mine for other in theirs):
        return
    listed = "; ".join(f"global rank {global_ranks[r]}: {text}" for r, text in enumerate(theirs))
    raise ValueError(
        "neuron: the ranks of a process group were started with different neuron-dist settings, "
        "which would make them post different gloo operations (gloo aborts the process on the "
        f"first collective). Set the same environment on every rank. Settings per rank: {listed}"
    )
