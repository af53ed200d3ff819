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

``mode`` may be ``None`` or ``"default"``: the other torch.compile modes select CUDA graphs or
GPU autotuning, which have no meaning on a NeuronCore.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

__all__ = ["CompileOptions"]

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
        if mode not in (None, "default"):
            raise ValueError(
                f"torch.compile(backend='neuron') does not support mode={mode!r}: it selects CUDA "
                "graphs or GPU autotuning. Use mode=None (the default).")
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
