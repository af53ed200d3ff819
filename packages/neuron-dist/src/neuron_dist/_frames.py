"""The signature exchange, with small collectives carried inside it (one round trip, not two).

Every checked collective starts with one gloo all-gather of a *frame* per rank: the rank's
signature (a fixed-size header, :mod:`neuron_dist._signature`) followed by a payload slot of
``slot`` bytes. Gloo aborts the process when ranks send messages of different sizes, so the
frame size must be equal on every rank *before* anything is known about the other ranks'
collective: ``slot`` is computed only from headers already exchanged (the previous collective's
payload size, the same on every rank), never from the local call.

When the collective's payload (all_reduce's tensor, all_gather's shard, reduce_scatter's input)
fits the slot on every rank, it travels in the frame: the all-gather that compares signatures
also moves the data, and the caller finishes the collective locally (copy the shards out, or
reduce the ranks' rows in rank order). Otherwise the frame carried the signatures only and the
caller runs gloo's collective as before. A mismatch raises :class:`CollectiveMismatchError` on
every rank either way, before any rank looks at the payload.

The slot is sized for the collective the group predicts from the exchanged headers (with
speculation on, :class:`neuron_dist._speculation.Predictor` learns each collective's payload
size with its successor), else for the last exchanged collective's payload (rounded up, at
least :data:`_MIN_SLOT`, at most what ``inline_limit`` allows). So a run of same-size
collectives -- a benchmark loop, FSDP's per-layer all-gathers, gradient buckets -- costs one
all-gather each, and so does a repeating mix of sizes (a barrier, then a run of all-gathers).
A collective larger than its slot costs a frame with no room for it plus gloo's collective
(two round trips, as without inlining; counted in ``frame_without_room``); a smaller one
sends some padding.

Collectives too large to inline pass their gloo operation (a :class:`Launch`) along; the header
carries its key, and when the group predicted it from the headers before
(:mod:`neuron_dist._speculation`) the operation is posted together with the exchange, so a
repeating pattern of large collectives also costs one round trip each.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from neuron_dist._signature import Signature, check_signatures, encode_fields, signature_width
from neuron_dist._speculation import LAUNCH_WORDS, NO_LAUNCH, Launch, Predictor, StandIns

__all__ = ["FrameExchange", "Posted"]

_ALIGN = 64  # header and slot sizes are multiples of this: payload rows stay aligned for any dtype
_MIN_SLOT = 4096  # bytes: room for tiny collectives after a large one (padding this small is free)
_NO_INLINE = -1
# Plain byte copies and compares for the small, contiguous buffers of every exchange: a tensor
# copy_ costs several microseconds of dispatch, a memmove well under one.
_memcmp = ctypes.CDLL(None).memcmp
_memcmp.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
_memcmp.restype = ctypes.c_int


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _outside_inference_mode(method: Callable[..., Any]) -> Callable[..., Any]:
    """Buffers and cached views outlive the call that makes them: a collective issued under
    ``torch.inference_mode()`` must not leave inference tensors that later collectives, outside
    inference mode, cannot update in place."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with torch.inference_mode(False):
            return method(*args, **kwargs)

    return wrapper


class _Frames:
    """The send and receive buffers for one slot size, with cached views into them."""

    @_outside_inference_mode
    def __init__(self, size: int, header_bytes: int, slot: int) -> None:
        frame = header_bytes + slot
        self.send = torch.zeros(frame, dtype=torch.uint8, device="cpu")
        self.recv = torch.empty(size * frame, dtype=torch.uint8, device="cpu")
        # this rank's header as int64 fields, written in place (cheaper than tensor indexing)
        self.header = (ctypes.c_int64 * (header_bytes // 8)).from_address(self.send.data_ptr())
        self._header_bytes = header_bytes
        self._send_address = self.send.data_ptr()
        self._addresses = [self.recv.data_ptr() + rank * frame for rank in range(size)]
        self.rows = self.recv.view(size, frame)[:, header_bytes:]  # every rank's payload slot, as bytes
        self.payload = self.send[header_bytes:]
        self.views: dict[tuple, object] = {}

    def headers_equal(self) -> bool:
        """Whether every rank's received header is byte for byte this rank's."""
        mine, nbytes = self._send_address, self._header_bytes
        return all(_memcmp(address, mine, nbytes) == 0 for address in self._addresses)

    def headers(self) -> torch.Tensor:
        """Every rank's header, ``(ranks, header words)`` int64."""
        return self.recv.view(len(self._addresses), -1)[:, : self._header_bytes].contiguous().view(torch.int64)

    def put_payload(self, payload: torch.Tensor, nbytes: int) -> None:
        """Copies ``payload`` (``nbytes`` bytes, a CPU tensor) into this rank's payload slot."""
        if payload.is_contiguous():
            ctypes.memmove(self._send_address + self._header_bytes, payload.data_ptr(), nbytes)
        else:
            self.send_view(payload.dtype, payload.shape).copy_(payload)

    def copy_rows(self, address: int, nbytes: int) -> None:
        """Copies the first ``nbytes`` of every rank's payload slot to ``address``, in rank order."""
        for rank, row in enumerate(self._addresses):
            ctypes.memmove(address + rank * nbytes, row + self._header_bytes, nbytes)

    def send_view(self, dtype: torch.dtype, shape: torch.Size) -> torch.Tensor:
        """This rank's payload slot as a ``dtype`` tensor of ``shape``."""
        key = ("send", dtype, shape)
        view = self.views.get(key)
        if view is None:
            self._make_room()
            count = _numel(shape)
            with torch.inference_mode(False):  # cached: see _outside_inference_mode
                view = self.views[key] = self.payload[: count * dtype.itemsize].view(dtype).view(shape)
        return view  # type: ignore[return-value]

    def rank_rows(self, dtype: torch.dtype, start: int, shape: torch.Size) -> list[torch.Tensor]:
        """Every rank's payload elements ``[start, start + numel(shape))`` as ``dtype`` tensors of ``shape``."""
        key = ("rows", dtype, start, shape)
        rows = self.views.get(key)
        if rows is None:
            self._make_room()
            end = (start + _numel(shape)) * dtype.itemsize
            with torch.inference_mode(False):
                rows = self.views[key] = [row[:end].view(dtype)[start:].view(shape) for row in self.rows]
        return rows  # type: ignore[return-value]

    def _make_room(self) -> None:
        if len(self.views) >= 256:
            self.views.clear()


@dataclasses.dataclass(frozen=True)
class Posted:
    """An exchange in flight: gloo's work, the frames it fills, and what this rank sent."""

    work: dist.Work
    frames: _Frames
    inline: bool  # this rank's payload is in its frame
    wanted: int  # this rank's payload size in bytes
    speculative: dist.Work | None = None  # the predicted launch or its stand-in (_speculation)
    matched: bool = False  # ``speculative`` is this rank's own launch


def _numel(shape: torch.Size) -> int:
    out = 1
    for s in shape:
        out *= s
    return out


class FrameExchange:
    """One group's frame all-gathers (see the module docstring); the slot size is shared state."""

    def __init__(self, gloo: dist.ProcessGroup, size: int, inline_limit: int, speculate: bool = False) -> None:
        self._gloo = gloo
        self._size = size
        self._width = signature_width(size)
        # header: signature fields, then [inline payload bytes or -1, payload bytes wanted], then
        # the collective's launch key (_speculation; -1s when it has none)
        self._launch_at = self._width + 2
        self._header_words = _round_up(self._launch_at + LAUNCH_WORDS, _ALIGN // 8)
        self._header_bytes = self._header_words * 8
        self._limit = inline_limit  # bytes gathered per collective (all ranks' frames) at most
        self._slot = self._next_slot(0)
        self._wanted = 0  # the last collective's payload, which self._slot was computed from
        self._buffers: OrderedDict[int, _Frames] = OrderedDict()
        self._encoded: dict[Signature, list[int]] = {}
        self.last: _Frames | None = None  # the buffers of the last exchange (its payloads, if inline)
        self._speculate = speculate
        self._predictor = Predictor()
        self._stand_ins = StandIns(gloo, size)
        self._speculated: dist.Work | None = None  # the last exchange's launch, if it was predicted
        self.speculation = {"hits": 0, "misses": 0}  # predicted launches used / discarded
        self.frame_without_room = 0  # payloads that could have travelled inline but the frame was too small

    def _next_slot(self, wanted: int) -> int:
        slot = max(_MIN_SLOT, _round_up(wanted, _ALIGN))
        if self._size * (self._header_bytes + slot) > self._limit:
            slot = _MIN_SLOT if self._size * (self._header_bytes + _MIN_SLOT) <= self._limit else 0
        return slot

    def _frames(self, slot: int) -> _Frames:
        frames = self._buffers.get(slot)
        if frames is None:
            frames = self._buffers[slot] = _Frames(self._size, self._header_bytes, slot)
            while len(self._buffers) > 3:  # a few recent sizes: alternating patterns keep their buffers
                self._buffers.popitem(last=False)
        elif len(self._buffers) > 1:
            self._buffers.move_to_end(slot)
        return frames

    def _update_slot(self, wanted: int) -> None:
        if wanted != self._wanted:
            self._wanted = wanted
            self._slot = self._next_slot(wanted)

    def _fields(self, signature: Signature) -> list[int]:
        fields = self._encoded.get(signature)
        if fields is None:
            fields = encode_fields(signature, self._size)
            if len(self._encoded) > 1024:
                self._encoded.clear()
            self._encoded[signature] = fields
        return fields

    def post(
        self,
        signature: Signature,
        seq: int,
        payload: torch.Tensor | None = None,
        wanted: int = 0,
        launch: Launch | None = None,
    ) -> Posted:
        """Starts the all-gather of this rank's frame (gloo runs it; see :meth:`complete`).

        ``payload`` (a CPU tensor, any dtype, contiguous or not) is what this rank would carry
        inline, ``wanted`` its size in bytes (0 for collectives that never inline; give it even
        when ``payload`` is None so the next slot fits). The payload is copied into the frame
        now. ``launch`` is the gloo operation the collective runs when its data does not travel
        inline; if the group predicts it (:mod:`neuron_dist._speculation`), it is posted now,
        right after the exchange. Only one exchange may be in flight: :meth:`complete` it before
        posting the next.
        """
        predicted, predicted_payload = self._predictor.next_collective() if self._speculate else (None, None)
        matched = predicted is not None and launch is not None and launch.key == predicted
        # the slot the predicted collective needs; else the last collective's (both the same on every rank)
        slot = self._slot if predicted_payload is None else self._next_slot(predicted_payload)
        frames = self._frames(slot)
        self.last = frames
        header = frames.header
        width = self._width
        header[:width] = self._fields(signature)
        header[0] = seq
        inline = payload is not None and wanted <= slot and not matched
        if payload is not None and not inline and not matched and self._next_slot(wanted) >= wanted:
            self.frame_without_room += 1  # a frame sized for it would have carried it
        header[width] = wanted if inline else _NO_INLINE
        header[width + 1] = wanted
        at = self._launch_at
        header[at : at + LAUNCH_WORDS] = launch.key.words() if launch is not None else NO_LAUNCH
        if inline and wanted:
            frames.put_payload(payload, wanted)
        if predicted is None:
            return Posted(self._gloo._allgather_base(frames.recv, frames.send), frames, inline, wanted)
        # the data first: it takes longer, and starts moving while the exchange is posted
        speculative = launch.post() if matched else self._stand_ins.post(predicted)  # type: ignore[union-attr]
        work = self._gloo._allgather_base(frames.recv, frames.send)
        return Posted(work, frames, inline, wanted, speculative, matched)

    def drain(self) -> None:
        """Lets stand-ins still in flight finish (see :meth:`StandIns.drain`)."""
        self._stand_ins.drain()

    def take_speculated(self) -> dist.Work | None:
        """The gloo work of the last completed exchange's collective, if it was posted with the
        exchange and every rank's call matched it (the caller then only waits for it)."""
        work, self._speculated = self._speculated, None
        return work

    def complete(
        self, posted: Posted, where: Callable[[], str], diagnose: Callable[[BaseException], BaseException]
    ) -> bool:
        """Waits for a posted exchange; raises :class:`CollectiveMismatchError` if signatures disagree.

        ``where()`` names the collective for a mismatch message; ``diagnose(error)`` turns a
        transport error into the error to raise. Returns whether every rank's payload travelled
        inline (read it from :attr:`last`); if not, the caller runs gloo's collective.
        """
        self._speculated = None
        try:
            posted.work.wait()
        except Exception as error:  # noqa: BLE001 (gloo raises plain RuntimeError)
            raise diagnose(error) from error
        frames = posted.frames
        if frames.headers_equal():
            self._update_slot(posted.wanted)
            # every rank sent this header: all learn the same, and agree on the speculation
            header = frames.header
            launch = NO_LAUNCH if posted.inline else tuple(header[self._launch_at : self._launch_at + LAUNCH_WORDS])
            self._predictor.record(tuple(header[1 : self._launch_at]), launch, posted.wanted)
            if posted.matched:
                self._speculated = posted.speculative
                self.speculation["hits"] += 1
            elif posted.speculative is not None:
                self.speculation["misses"] += 1  # a stand-in on every rank: it finishes in the background
            return posted.inline
        self._predictor.forget_previous()
        if posted.speculative is not None:
            self.speculation["misses"] += 1
            self._wait(posted, diagnose)  # every rank posted one: let them all finish it
        width = self._width
        headers = frames.headers()
        self._update_slot(int(headers[:, width + 1].max()))  # before raising: every rank agrees
        check_signatures(headers[:, :width].contiguous(), self._size, where())
        # compatible signatures that differ in fields that need not agree (all_gather input shapes)
        return bool((headers[:, width] >= 0).all())

    @staticmethod
    def _wait(posted: Posted, diagnose: Callable[[BaseException], BaseException]) -> None:
        """Waits for a speculative launch whose result is not used (a stand-in, or a miss)."""
        try:
            posted.speculative.wait()  # type: ignore[union-attr]
        except Exception as error:  # noqa: BLE001
            raise diagnose(error) from error
