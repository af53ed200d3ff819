"""Speculative data movement: a large collective's gloo operation posted alongside its signature exchange.

A checked collective too large to travel inside the exchange frame (:mod:`neuron_dist._frames`)
costs two round trips: the exchange, then gloo's collective. Training loops issue the same
sequence of collectives step after step, so the group predicts the next collective from the one
before it and posts gloo's operation for it *together with* the exchange; when the exchange shows
every rank issued exactly the predicted collective, the data is already moving and the collective
costs one round trip.

Gloo aborts the process when ranks post operations of different sizes, so what is posted must be
the same on every rank before anything is known about the other ranks' calls. The prediction is
therefore made only from exchanged headers (the same on every rank): after the previous
collectives, the group looks up which launch followed the same collectives last time. Each rank posts
the predicted launch on its own tensors if its call matches it, and otherwise a *stand-in* of
the same kind, dtype and size on scratch buffers. After the exchange:

* every rank matched (headers equal and equal to the prediction): the collective is done
  when gloo's operation completes;
* no rank matched (a consistent miss): the stand-ins finish in the background, their result
  unused, and the collective runs as without speculation;
* ranks disagree: the signature check raises on every rank, as without speculation.

A stand-in all_reduce contributes the identity of the reduce op, so a rank whose own tensor took
part keeps its value when only it matched. A rank's output (all_gather, reduce_scatter) may hold
stand-in data until the collective runs again or raises. Predictions come from the last few
runs of equal collectives (see :class:`Predictor`): a training step's sequence is learnt after
one or two steps, and a changing pattern stops being predicted instead of paying for wasted
transfers every time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d

__all__ = ["GLOO_DTYPES", "LAUNCH_WORDS", "NO_LAUNCH", "Launch", "LaunchKey", "Predictor", "StandIns"]

_RedOpType = dist.ReduceOp.RedOpType
_KINDS = ("all_reduce", "all_gather", "reduce_scatter")
# The dtypes gloo moves as they are (the others travel as bytes); a launch key codes them by position.
GLOO_DTYPES = (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
    torch.int8, torch.uint8, torch.bool,
)
LAUNCH_WORDS = 4  # header words: kind, dtype, numel, reduce op (all -1: no launch)
NO_LAUNCH = (-1,) * LAUNCH_WORDS
_MAX_PREDICTIONS = 4096
_MAX_RUN = 1 << 16  # run lengths beyond this count as this
_IDLE_BYTES = 64 << 20  # scratch kept for later stand-ins, at most (larger ones are made per use)
_CONTEXT_RUNS = 3  # runs of history a successor is learnt for (besides the last run alone)
_AFTER_MISMATCH: tuple[int, ...] = ()  # the "previous header" after ranks disagreed (no real header is empty)


@dataclasses.dataclass(frozen=True)
class LaunchKey:
    """One gloo operation, as every rank must post it: kind, wire dtype, size and reduce op.

    ``numel`` counts the elements this rank sends: all_reduce's tensor, all_gather's shard,
    reduce_scatter's whole input.
    """

    kind: str
    dtype: torch.dtype
    numel: int
    reduce_op: _RedOpType | None = None

    def words(self) -> tuple[int, ...]:
        op = -1 if self.reduce_op is None else int(self.reduce_op)
        return (_KINDS.index(self.kind), GLOO_DTYPES.index(self.dtype), self.numel, op)

    @staticmethod
    def from_words(words: Sequence[int]) -> LaunchKey:
        kind, dtype, numel, op = (int(w) for w in words)
        return LaunchKey(_KINDS[kind], GLOO_DTYPES[dtype], numel, None if op < 0 else _RedOpType(op))


@dataclasses.dataclass(frozen=True)
class Launch:
    """A collective's gloo operation on this rank's tensors, ready to be posted early."""

    key: LaunchKey
    post: Callable[[], dist.Work]


def _identity(dtype: torch.dtype, op: _RedOpType | None) -> float | int | bool:
    """The value that leaves the other ranks' values unchanged under ``op``."""
    if op in (None, _RedOpType.SUM, _RedOpType.BOR, _RedOpType.BXOR):
        return -0.0 if dtype.is_floating_point else 0  # -0.0 + x == x, also for x == -0.0
    if op == _RedOpType.PRODUCT:
        return 1
    if dtype == torch.bool:
        return op in (_RedOpType.MIN, _RedOpType.BAND)
    if op == _RedOpType.BAND:
        return 255 if dtype == torch.uint8 else -1  # all bits set
    if dtype.is_floating_point:
        return float("inf") if op == _RedOpType.MIN else float("-inf")
    info = torch.iinfo(dtype)
    return info.max if op == _RedOpType.MIN else info.min


def _nbytes(buffers: tuple[torch.Tensor, torch.Tensor]) -> int:
    send, recv = buffers
    return send.nbytes + (recv.nbytes if recv is not send else 0)


class StandIns:
    """Posts the stand-in of a predicted launch on scratch buffers.

    Nobody waits for a stand-in: its transfer finishes in the background while the collective
    runs. Buffers are reused once the stand-in that last used them completed (up to
    :data:`_IDLE_BYTES` of them are kept).
    """

    def __init__(self, gloo: dist.ProcessGroup, size: int) -> None:
        self._gloo = gloo
        self._size = size
        self._idle: dict[LaunchKey, tuple[torch.Tensor, torch.Tensor]] = {}
        self._busy: list[tuple[dist.Work, LaunchKey, tuple[torch.Tensor, torch.Tensor]]] = []

    def _buffers(self, key: LaunchKey) -> tuple[torch.Tensor, torch.Tensor]:
        still_busy = []
        for work, used_key, buffers in self._busy:
            if work.is_completed():
                if sum(_nbytes(kept) for kept in self._idle.values()) + _nbytes(buffers) <= _IDLE_BYTES:
                    self._idle[used_key] = buffers
            else:
                still_busy.append((work, used_key, buffers))
        self._busy = still_busy
        buffers = self._idle.pop(key, None)
        if buffers is None:
            with torch.inference_mode(False):
                send = torch.empty(key.numel, dtype=key.dtype, device="cpu")
                if key.kind == "all_gather":
                    recv = torch.empty(key.numel * self._size, dtype=key.dtype, device="cpu")
                elif key.kind == "reduce_scatter":
                    recv = torch.empty(key.numel // self._size, dtype=key.dtype, device="cpu")
                else:
                    recv = send
            buffers = (send, recv)
        return buffers

    def drain(self) -> None:
        """Waits for the stand-ins still moving data (before the transport shuts down); their
        errors are nobody's: a peer that already left fails them."""
        busy, self._busy = self._busy, []
        for work, _, _ in busy:
            try:
                work.wait()
            except Exception:  # noqa: BLE001,S110
                pass

    def post(self, key: LaunchKey) -> dist.Work:
        """Posts gloo's operation for ``key`` (its buffers stay alive until it completes)."""
        buffers = self._buffers(key)
        send, recv = buffers
        if key.kind == "all_reduce":
            send.fill_(_identity(key.dtype, key.reduce_op))  # reduced in place: refilled every time
            opts = _c10d.AllreduceOptions()
            opts.reduceOp = key.reduce_op
            work = self._gloo.allreduce([send], opts)
        elif key.kind == "all_gather":
            work = self._gloo._allgather_base(recv, send)
        else:
            opts = _c10d.ReduceScatterOptions()
            opts.reduceOp = key.reduce_op
            work = self._gloo._reduce_scatter_base(recv, send, opts)
        self._busy.append((work, key, buffers))
        return work


_Run = tuple[tuple[int, ...], int]  # a header and how many times in a row it was exchanged


class Predictor:
    """Which launch (and payload size) follows each exchanged header, learnt identically on every rank.

    Headers (without their sequence number) that every rank sent are the only input, so all
    ranks predict the same launch. The history is kept as runs (a header, how many times in a
    row); a successor is learnt for the last :data:`_CONTEXT_RUNS` runs and for the last run
    alone, and the longest context known is used. So a run of N equal collectives and what
    follows it are learnt after one pass, and so is a step whose calls repeat in a longer cycle
    (the same collective followed by different ones, told apart by what came before). Each entry
    keeps a two-state confidence (one different successor lowers it, two replace it), so a loop's
    exit does not unlearn the loop. For run lengths not seen before, a table keyed by the
    previous header alone is used once it saw the same successor twice in a row (a long loop of
    one collective).
    """

    def __init__(self) -> None:
        self._runs: tuple[_Run, ...] = ()  # the last runs, oldest first
        self._learnt: dict[tuple[_Run, ...], tuple[tuple[int, ...], int]] = {}
        self._generic: dict[tuple[int, ...] | None, tuple[tuple[int, ...], bool]] = {}

    def _contexts(self) -> tuple[tuple[_Run, ...], ...]:
        last = self._runs[-1:]
        return (self._runs, last) if len(self._runs) > 1 else (last,)

    def _previous(self) -> tuple[int, ...] | None:
        return self._runs[-1][0] if self._runs else None

    def predict(self) -> LaunchKey | None:
        """The launch to post with the next exchange, if one is predicted."""
        return self.next_collective()[0]

    def next_collective(self) -> tuple[LaunchKey | None, int | None]:
        """The next collective's launch (None if none is predicted, or it has none) and the
        payload it will want to carry in the exchange frame, in bytes (None if not predicted)."""
        for context in self._contexts():
            entry = self._learnt.get(context)
            if entry is not None and entry[1] > 0:
                successor = entry[0]
                break
        else:
            generic = self._generic.get(self._previous())
            if generic is None or not generic[1]:
                return None, None
            successor = generic[0]
        words = successor[:LAUNCH_WORDS]
        return None if words == NO_LAUNCH else LaunchKey.from_words(words), successor[LAUNCH_WORDS]

    def record(self, header: tuple[int, ...], launch_words: tuple[int, ...], wanted: int = 0) -> None:
        """Every rank exchanged ``header`` (sequence number left out), whose launch was
        ``launch_words`` and whose payload was ``wanted`` bytes."""
        successor = (*launch_words, wanted)
        if len(self._learnt) >= _MAX_PREDICTIONS:
            self._learnt.clear()
            self._generic.clear()
        for context in self._contexts():
            entry = self._learnt.get(context)
            if entry is None or (entry[0] != successor and entry[1] == 0):
                self._learnt[context] = (successor, 1)
            elif entry[0] == successor:
                self._learnt[context] = (successor, 2)
            else:
                self._learnt[context] = (entry[0], entry[1] - 1)
        previous = self._previous()
        generic = self._generic.get(previous)
        self._generic[previous] = (successor, generic is not None and generic[0] == successor)
        if header == previous:
            self._runs = (*self._runs[:-1], (header, min(self._runs[-1][1] + 1, _MAX_RUN)))
        else:
            self._runs = (*self._runs, (header, 1))[-_CONTEXT_RUNS:]

    def forget_previous(self) -> None:
        """The ranks' headers differed: the next collective follows a mismatch (nothing else known)."""
        self._runs = ((_AFTER_MISMATCH, 1),)
