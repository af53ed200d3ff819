"""neuron-dist's settings from the environment, read once.

``NEURON_DIST_CHECK_SIGNATURES`` (default ``1``): exchange collective signatures before data
moves, so mismatched calls raise :class:`CollectiveMismatchError` on every rank. ``0`` skips the
exchange (one small all-gather less per collective); mismatches then abort the process inside
gloo, or mix data of equal-width dtypes, as plain gloo does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["DistConfig", "config"]


@dataclass(frozen=True)
class DistConfig:
    check_signatures: bool


def _load() -> DistConfig:
    value = os.environ.get("NEURON_DIST_CHECK_SIGNATURES", "1").strip()
    if value not in ("0", "1"):
        raise ValueError(f"NEURON_DIST_CHECK_SIGNATURES must be 0 or 1, got {value!r}")
    return DistConfig(check_signatures=value == "1")


config = _load()
