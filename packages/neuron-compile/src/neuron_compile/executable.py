"""The compiled program for one graph and one set of input shapes: our analogue of a NEFF.

A :class:`NeuronExecutable` is self-contained: Inductor's serialised forward/backward program
(generated Python wrapper, AOTAutograd metadata) plus the shared objects of its C++ kernels.
``to_bytes``/``from_bytes`` move it between processes; ``load`` turns it into a callable
without compiling anything (the kernels are placed where Inductor looks for them, so its C++
compiler is never invoked).

Byte layout::

    8 bytes   magic b"NEURONEX"
    2 bytes   format version (big-endian, 1)
    4 bytes   header length H (big-endian)
    H bytes   JSON header: {"torch": version, "program": size, "kernels": [[path, size], ...],
              "support": [[path, size], ...], "isa_probes": {"cpu": fingerprint,
              "loaded": {path: bool, ...}}, "precompiled_headers": {key: path, ...}}
    ...       the program, then each kernel binary, then each support file, in header order

Support files are binaries Inductor looks for before it loads kernels (its vector-ISA probes);
``isa_probes`` records whether each probe loaded on the compiling CPU, so that a process on a
CPU with the same fingerprint need not probe again (:mod:`neuron_compile._isa_probes`).
``precompiled_headers`` records the names Inductor gave its precompiled headers, so that such a
process need not run the C preprocessor to name them again (:mod:`neuron_compile._header_names`).
Both keys are optional: executables written without them load as before.
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
import tempfile
from collections.abc import Callable
from typing import Any

import torch

from neuron_compile._output_code import LIGHT_PROGRAM_MARKER, defer_inductor_debug

__all__ = ["NeuronExecutable", "ExecutableFormatError"]

_LIGHT_MARKER = LIGHT_PROGRAM_MARKER.encode()

_MAGIC = b"NEURONEX"
_VERSION = 1
_PREFIX = struct.Struct(">8sHI")


class ExecutableFormatError(ValueError):
    """Bytes that are not a neuron executable this torch and torch-neuronx can load."""


@dataclasses.dataclass(frozen=True)
class NeuronExecutable:
    """A compiled graph: Inductor's program and the binaries of its C++ kernels."""

    program: bytes
    kernels: dict[str, bytes]  # path relative to Inductor's cache directory -> shared object
    torch_version: str = torch.__version__
    support: dict[str, bytes] = dataclasses.field(default_factory=dict)  # same keys; not kernels
    isa_probes: dict[str, bool] = dataclasses.field(default_factory=dict)  # probe library -> loaded
    cpu: str = ""  # fingerprint of the CPU isa_probes and header_names were obtained on
    header_names: dict[str, str] = dataclasses.field(default_factory=dict)  # see _header_names

    @property
    def light(self) -> bool:
        """Whether the program imports none of Inductor's lowering modules (see
        :mod:`neuron_compile._output_code`): true of what this version's code generator writes."""
        return _LIGHT_MARKER in self.program

    def to_bytes(self) -> bytes:
        """Serialises the executable (see the module docstring for the layout)."""
        names = sorted(self.kernels)
        support = sorted(self.support)
        header = json.dumps({
            "torch": self.torch_version,
            "program": len(self.program),
            "kernels": [[name, len(self.kernels[name])] for name in names],
            "support": [[name, len(self.support[name])] for name in support],
            "isa_probes": {"cpu": self.cpu, "loaded": self.isa_probes},
            "precompiled_headers": self.header_names,
        }).encode()
        parts = [_PREFIX.pack(_MAGIC, _VERSION, len(header)), header, self.program]
        parts += [self.kernels[name] for name in names]
        parts += [self.support[name] for name in support]
        return b"".join(parts)

    @classmethod
    def from_bytes(cls, data: bytes) -> NeuronExecutable:
        """Parses bytes written by :meth:`to_bytes`; raises ExecutableFormatError otherwise."""
        if len(data) < _PREFIX.size:
            raise ExecutableFormatError("neuron executable is truncated (no header)")
        magic, version, header_size = _PREFIX.unpack_from(data)
        if magic != _MAGIC or version != _VERSION:
            raise ExecutableFormatError(
                f"not a neuron executable of format {_VERSION} (magic {magic!r}, version {version})")
        offset = _PREFIX.size
        try:
            header = json.loads(data[offset:offset + header_size])
        except ValueError as error:
            raise ExecutableFormatError(f"neuron executable header is unreadable: {error}") from None
        offset += header_size
        support_sizes = header.get("support", [])
        sizes = [header["program"]] + [size for _, size in header["kernels"]] + [size for _, size in support_sizes]
        if offset + sum(sizes) != len(data):
            raise ExecutableFormatError(
                f"neuron executable is {len(data)} bytes, its header describes {offset + sum(sizes)}")
        program = data[offset:offset + header["program"]]
        offset += header["program"]
        kernels, offset = _files(data, offset, header["kernels"])
        support, offset = _files(data, offset, support_sizes)
        probes = header.get("isa_probes", {})
        return cls(program=program, kernels=kernels, torch_version=header["torch"], support=support,
                   isa_probes=dict(probes.get("loaded", {})), cpu=probes.get("cpu", ""),
                   header_names=dict(header.get("precompiled_headers", {})))

    def load(self) -> Callable[..., Any]:
        """The executable as a callable taking the graph's flat inputs."""
        if self.torch_version != torch.__version__:
            raise ExecutableFormatError(
                f"this neuron executable was compiled by torch {self.torch_version}, but torch "
                f"{torch.__version__} is running; recompile it (clear the compile cache)")
        _install_kernels(self.support | self.kernels)
        from torch._inductor.standalone_compile import AOTCompiledArtifact

        import neuron_compile._device_ops  # noqa: F401 - defines the custom ops programs may call
        defer_inductor_debug()  # Inductor's programs read two of its flags when run; its lowering imports it
        from neuron_compile import _header_names, _isa_probes

        with _isa_probes.answered_from(self.isa_probes, self.cpu), \
                _header_names.answered_from(self.header_names, self.cpu):
            return AOTCompiledArtifact.deserialize(self.program)


def _files(data: bytes, offset: int, entries: list[list[Any]]) -> tuple[dict[str, bytes], int]:
    """The files ``entries`` ([name, size] pairs) describe, read from ``data`` at ``offset``."""
    files = {}
    for name, size in entries:
        files[name] = data[offset:offset + size]
        offset += size
    return files, offset


def _install_kernels(kernels: dict[str, bytes]) -> None:
    """Places kernel binaries in Inductor's cache directory, where it looks before compiling."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    root = cache_dir()
    for name, binary in kernels.items():
        path = os.path.join(root, name)
        if os.path.exists(path):
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(binary)
            os.chmod(temporary, 0o755)
            os.replace(temporary, path)
        except BaseException:
            if os.path.exists(temporary):
                os.unlink(temporary)
            raise
