"""Inductor's vector-ISA probe results, recorded at compile time and replayed at load time.

Before Inductor loads a C++ kernel it decides the CPU's vector ISA. For each candidate ISA it
builds a small probe library and ``dlopen``s it in a child Python process, so that an ISA the
CPU or OS refuses cannot crash the caller: 3-5 child processes, about 0.3 s each, in every
process that loads a kernel. An executable carries the probe libraries and their outcomes with
a fingerprint of the CPU they were obtained on; a process that loads it on a CPU with the same
fingerprint answers those probes from the record, and any other probe, or any probe on another
CPU, runs as usual.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import platform
import threading
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["Replay", "answered_from", "cpu_fingerprint", "install_once", "install_recorder", "recorded_outcomes"]

_lock = threading.Lock()
_outcomes: dict[str, bool] = {}  # probe library, relative to Inductor's cache directory -> loaded


def _relative(path: str) -> str | None:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    relative = os.path.relpath(os.path.abspath(path), os.path.abspath(cache_dir()))
    return None if relative.startswith("..") else relative


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            lines = [line for line in info if line.startswith(("flags", "Features", "model name"))]
    except OSError:
        return ""
    return "".join(sorted(set(lines)))


@functools.cache  # the CPU does not change under a running process
def cpu_fingerprint() -> str:
    """Identifies what decides a probe's outcome: the CPU's features, the OS and this torch."""
    parts = [platform.machine(), platform.system(), torch.__version__,
             torch.backends.cpu.get_cpu_capability(), _cpu_flags()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def install_once(owner: Any, name: str, wrap: Any) -> None:
    """Replaces ``owner.name`` by ``wrap(original)``, once per process; nothing if it is missing."""
    original = getattr(owner, name, None)
    if original is None or getattr(original, "_neuron_recorder", False):
        return
    wrapped = wrap(original)
    wrapped._neuron_recorder = True
    setattr(owner, name, wrapped)


class Replay:
    """A record of answers obtained on some CPU, consulted within :meth:`answered_from`."""

    def __init__(self, install: Any) -> None:
        self._install = install
        self.active: dict[str, Any] | None = None  # while a load replays a record

    @contextlib.contextmanager
    def answered_from(self, record: dict[str, Any], fingerprint: str) -> Iterator[None]:
        """Within this context, answers in ``record`` obtained on this CPU are not sought again."""
        if not record or fingerprint != cpu_fingerprint():
            yield
            return
        self._install()
        previous, self.active = self.active, dict(record)
        try:
            yield
        finally:
            self.active = previous


def _probing(original: Any) -> Any:
    def probe_load(isa: Any, output_path: str) -> bool:
        relative = _relative(output_path)
        replayed = _replay.active
        if replayed is not None and relative in replayed and os.path.isfile(output_path):
            outcome = replayed[relative]
        else:
            outcome = original(isa, output_path)
        if relative is not None:
            with _lock:
                _outcomes[relative] = outcome
        return outcome

    return probe_load


def install_recorder() -> None:
    """Records (and, inside :func:`answered_from`, replays) every probe of this process.

    Best effort: a torch without ``VecISA._probe_load`` simply probes as it always does.
    """
    try:
        from torch._inductor.cpu_vec_isa import VecISA
    except ImportError:
        return
    install_once(VecISA, "_probe_load", _probing)


_replay = Replay(install_recorder)
# Within this context, probes recorded in ``outcomes`` on this CPU are not run again.
answered_from = _replay.answered_from


def recorded_outcomes() -> dict[str, bool]:
    """Probe libraries of this process (relative to Inductor's cache) and whether they loaded."""
    with _lock:
        return dict(_outcomes)
