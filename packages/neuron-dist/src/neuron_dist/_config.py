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
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["DistConfig", "config"]


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
