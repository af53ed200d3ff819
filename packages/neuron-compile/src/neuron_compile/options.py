"""Options of ``torch.compile(..., backend="neuron", options={...})``, validated once.

=========================  =======  ==========================================================
option                     default  meaning
=========================  =======  ==========================================================
``fallback_to_eager``      False    a graph the compiler cannot handle runs eagerly (counted in
                                    the metrics) instead of raising; also
                                    ``TORCH_NEURONX_FALLBACK_TO_EAGER=1``
``cache``                  True     use the persistent compile cache (see ``cache.py``)
``graph_warning_threshold`` 16      graphs one function may compile before a warning names the
                                    input dimension that keeps changing
=========================  =======  ==========================================================

torch.compile's modes are accepted, as CPU Inductor accepts them for CPU graphs:
``"reduce-overhead"`` asks for CUDA graphs, which a NeuronCore does not have (a compiled graph
already runs as one program), so it compiles as the default mode; ``"max-autotune"`` and
``"max-autotune-no-cudagraphs"`` ask for GPU kernel autotuning, which the neuron compiler does
not do: they compile as the default mode too, with one warning per process. Other mode names
are refused.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Mapping
from typing import Any

__all__ = ["CompileOptions", "accept_mode"]

_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
_warned_autotune = False


def accept_mode(mode: str | None) -> None:
    """Checks a torch.compile mode; warns once that autotuning modes compile as the default."""
    global _warned_autotune
    if mode is not None and mode not in _MODES:
        raise ValueError(f"torch.compile(backend='neuron') got an unknown mode={mode!r}; "
                         f"use one of {', '.join(_MODES)} (all compile alike on neuron)")
    if mode is not None and mode.startswith("max-autotune") and not _warned_autotune:
        _warned_autotune = True
        warnings.warn(f"torch.compile mode={mode!r} on neuron: the neuron compiler does no kernel "
                      "autotuning; compiling as mode='default'", stacklevel=4)

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _env_flag(name: str) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{name}={os.environ[name]!r} is not a boolean; use 1 or 0")


@dataclasses.dataclass(frozen=True)
class CompileOptions:
    """What the caller asked of the neuron compiler."""

    fallback_to_eager: bool = False
    cache: bool = True
    graph_warning_threshold: int = 16  # the default bucket policy's graph count: correct use stays quiet

    @classmethod
    def resolve(cls, mode: str | None = None, options: Mapping[str, Any] | None = None) -> CompileOptions:
        """Validates torch.compile's ``mode`` and ``options`` for the neuron backend."""
        accept_mode(mode)
        fields = {field.name: field for field in dataclasses.fields(cls)}
        values: dict[str, Any] = {"fallback_to_eager": _env_flag("TORCH_NEURONX_FALLBACK_TO_EAGER")}
        for name, value in (options or {}).items():
            if name not in fields:
                raise ValueError(
                    f"torch.compile(backend='neuron') got an unsupported option {name!r}; "
                    f"supported options: {', '.join(sorted(fields))}")
            expected = bool if fields[name].type == "bool" else int
            if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
                raise TypeError(f"option {name!r} must be {expected.__name__}, got {value!r}")
            values[name] = value
        resolved = cls(**values)
        if resolved.graph_warning_threshold < 1:
            raise ValueError("option 'graph_warning_threshold' must be at least 1")
        return resolved
