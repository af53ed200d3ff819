"""Predicted signatures: a collective that repeats the group's last one overlaps its check.

A collective too large to travel inside the signature exchange (:mod:`neuron_dist._frames`)
costs two round trips: the exchange, then gloo's collective. But training and benchmark loops
repeat themselves (FSDP's per-layer all-gathers, a gradient all-reduce every step), and once
every rank has agreed on the same signature for an operation twice in a row, each rank can
*predict* the next one. The prediction is common knowledge: it is derived only from exchanged,
agreed signatures, so every rank holds the same one and takes the same path.

With a prediction, each rank posts the exchange and, at the same time, the data collective:
the real one if its own call matches the prediction, else the same gloo call on scratch
buffers of the predicted sizes (so gloo's message sizes match on every rank whatever the
calls were). When the exchange completes:

* every rank matched the prediction: the real collective is already in flight everywhere.
* every rank's call is compatible with the others' but not all matched: the speculative
  collective is waited for and discarded, and the real one runs (out-of-place outputs are
  rewritten; an in-place all_reduce can only get here when no rank matched, so no rank ran it).
* the calls disagree: every rank waits for the speculative collective and raises
  :class:`CollectiveMismatchError`, as without a prediction. Tensors of a mismatched collective
  are undefined afterwards (ranks whose call matched the prediction received scratch data).

Only collectives above their inline limit are predicted, so small ones keep travelling inside
the exchange. A miss costs one discarded collective of the predicted size, and it resets the
operation's streak, so alternating sizes (several gradient buckets) never speculate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from neuron_dist._signature import Signature

__all__ = ["Streaks", "scratch_launcher"]

_PREDICT_AFTER = 2  # agreed repetitions of one signature before the next call is predicted

Launch = Callable[[], list[dist.Work]]


def scratch_launcher(launch: Callable[..., list[dist.Work]], *wire_lists: list[torch.Tensor]) -> Launch:
    """``launch`` applied to fresh buffers shaped like ``wire_lists`` (allocated only if it runs)."""
    specs = [[(wire.shape, wire.dtype) for wire in wires] for wires in wire_lists]

    def start() -> list[dist.Work]:
        return launch(*[[torch.empty(shape, dtype=dtype) for shape, dtype in spec] for spec in specs])

    return start


@dataclass(frozen=True)
class _Streak:
    signature: Signature
    count: int
    scratch: Launch  # the agreed call's gloo collective, on scratch buffers of its sizes


class Streaks:
    """Per operation, the last agreed signature, how often it repeated, and its scratch launch."""

    def __init__(self) -> None:
        self._streaks: dict[str, _Streak] = {}
        self.hits = 0  # collectives whose check overlapped their data (tests and benchmarks read it)
        self.misses = 0

    def prediction(self, op: str) -> _Streak | None:
        """The predicted call of ``op``, if its signature repeated often enough."""
        streak = self._streaks.get(op)
        return streak if streak is not None and streak.count >= _PREDICT_AFTER else None

    def take(self, op: str) -> _Streak | None:
        """Removes and returns ``op``'s streak: called before each checked collective of ``op``,
        so that a collective that fails leaves no streak behind (on any rank)."""
        return self._streaks.pop(op, None)

    def record(self, signature: Signature, agreed: bool, scratch: Launch, previous: _Streak | None) -> None:
        """Notes an exchange of ``signature`` (``agreed``: every rank sent the same header)."""
        if not agreed:
            return
        count = previous.count + 1 if previous is not None and previous.signature == signature else 1
        self._streaks[signature.op] = _Streak(signature, count, scratch)
