"""Inductor's precompiled-header names, recorded at compile time and replayed at load time.

The first time a process loads a C++ kernel, Inductor names the precompiled header the kernel
would be built with: it runs the C preprocessor over the ATen headers the kernel includes and
hashes the output (about 0.3 s), even when the kernel's shared object is already there and
nothing gets compiled. An executable carries the names its compiling process obtained, keyed
by the header and the compiler command line; a process that loads it on a CPU with the same
fingerprint (:func:`neuron_compile._isa_probes.cpu_fingerprint`, which includes the torch
version) takes the name from the record when that precompiled header exists on this machine,
and otherwise asks Inductor as usual.

A replayed name only matters if a kernel gets compiled during the load, which the executable's
own kernel binaries prevent; even then the compiler would check the precompiled header it names
and fall back to the plain header (a one-line ``#include``) if it does not match.
"""

from __future__ import annotations

import hashlib
import os
import threading
from typing import Any

from neuron_compile._isa_probes import Replay, install_once

__all__ = ["answered_from", "install_recorder", "recorded_names"]

_lock = threading.Lock()
_names: dict[str, str] = {}  # _key(header, command line) -> header path relative to _header_dir()


def _key(header: str, command_line: str) -> str:
    return hashlib.sha256(f"{header}\n{command_line}".encode()).hexdigest()[:32]


def _header_dir() -> str:
    from torch._inductor import codecache

    return codecache._HEADER_DIR


def _exists(path: str) -> bool:
    """The header Inductor writes and the precompiled header the compiler builds next to it."""
    return os.path.isfile(path) and any(os.path.isfile(path + suffix) for suffix in (".gch", ".pch"))


def _naming(original: Any) -> Any:
    def precompile_header(*args: Any, **compile_command: Any) -> Any:
        if len(args) != 2 or not all(isinstance(arg, str) for arg in args):
            return original(*args, **compile_command)  # not the (header, command line) we know
        header, hashable_cmd_line = args
        key = _key(header, hashable_cmd_line)
        replayed = _replay.active
        if replayed is not None and key in replayed:
            path = os.path.join(_header_dir(), replayed[key])
            if _exists(path):
                return path
        path = original(header, hashable_cmd_line, **compile_command)
        if not isinstance(path, str):
            return path
        relative = os.path.relpath(path, _header_dir())
        if not relative.startswith(".."):
            with _lock:
                _names[key] = relative
        return path

    return precompile_header


def install_recorder() -> None:
    """Records (and, inside :func:`answered_from`, replays) the header names of this process.

    Best effort: a torch without ``codecache._precompile_header`` names its headers as it
    always does.
    """
    try:
        from torch._inductor import codecache
    except ImportError:
        return
    install_once(codecache, "_precompile_header", _naming)


def recorded_names() -> dict[str, str]:
    """The precompiled-header names this process obtained from Inductor, by key."""
    with _lock:
        return dict(_names)


_replay = Replay(install_recorder)
# Within this context, headers named in a record obtained on this CPU are not named again.
answered_from = _replay.answered_from
