"""Streams and events (torch.cuda.Stream/Event's API over torch.Stream/torch.Event).

The emulator executes synchronously, in program order, so the ordering guarantees of
streams and events always hold: a recorded event is complete, waiting never blocks, and
``Event.elapsed_time`` measures host time between two records.
"""

from __future__ import annotations

from typing import Any

import torch

from neuron_runtime import _C

__all__ = [
    "Event", "Stream", "StreamContext", "current_stream", "default_stream", "set_stream",
    "stream", "synchronize",
]


class Stream(torch.Stream):
    """A neuron stream. ``priority``: 0 (default) or negative for higher priority."""

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> "Stream":
        if "stream_id" in kwargs:
            return super().__new__(cls, **kwargs)
        from neuron_runtime.neuron import _device_index

        index = _device_index(device)
        return super().__new__(cls, device=torch.device("neuron", index), priority=priority)

    @property
    def priority(self) -> int:  # type: ignore[override]
        return _C._stream_priority(self.stream_id, self.device_index)

    def __repr__(self) -> str:
        return f"<torch.neuron.Stream device=neuron:{self.device_index} stream_id={self.stream_id}>"


class _EventMeta(type):
    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, torch.Event) and obj.device.type == "neuron"


class Event(metaclass=_EventMeta):
    """A neuron event; ``enable_timing=True`` allows elapsed_time().

    Instances are plain ``torch.Event`` objects on the neuron device (torch's event methods
    accept only that exact type), so ``isinstance(e, torch.neuron.Event)`` checks the device.
    """

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> torch.Event:  # type: ignore[misc]
        return torch.Event(device="neuron", enable_timing=enable_timing, blocking=blocking,
                           interprocess=interprocess)


def _wrap(base: torch.Stream) -> Stream:
    return Stream(stream_id=base.stream_id, device_index=base.device_index, device_type=base.device_type)


def current_stream(device: Any = None) -> Stream:
    """The calling thread's current stream on a core."""
    from neuron_runtime.neuron import _device_index

    return _wrap(torch._C._accelerator_getStream(_device_index(device)))


def default_stream(device: Any = None) -> Stream:
    """A core's default stream."""
    current = current_stream(device)
    return Stream(stream_id=0, device_index=current.device_index, device_type=current.device_type)


def set_stream(stream: torch.Stream | None) -> None:
    """Makes a stream current on its core for this thread."""
    if stream is not None:
        torch._C._accelerator_setStream(stream)


class StreamContext:
    """Context manager that makes a stream current (``with torch.neuron.stream(s):``).

    As ``torch.cuda.StreamContext``: a stream on another core also makes that core current
    inside the block; on exit both cores get their previous streams back and the core that
    was current before is current again.
    """

    def __init__(self, stream: torch.Stream | None) -> None:
        self.stream = stream
        self.source_previous: torch.Stream | None = None
        self.destination_previous: torch.Stream | None = None

    def __enter__(self) -> torch.Stream | None:
        if self.stream is None:
            return None
        self.source_previous = current_stream()
        if self.source_previous.device_index != self.stream.device_index:
            self.destination_previous = current_stream(self.stream.device_index)
        set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc: object) -> bool:
        if self.destination_previous is not None:
            set_stream(self.destination_previous)
        if self.source_previous is not None:
            set_stream(self.source_previous)  # also makes its core current again
        return False


def stream(stream: torch.Stream | None) -> StreamContext:
    """Context manager that makes ``stream`` current."""
    return StreamContext(stream)


def synchronize(device: Any = None) -> None:
    """Waits for all work on a core (always complete on the emulator)."""
    from neuron_runtime.neuron import _device_index

    torch._C._accelerator_synchronizeDevice(_device_index(device))
