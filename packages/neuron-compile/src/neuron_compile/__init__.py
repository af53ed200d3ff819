"""neuron-compile: ``torch.compile(model, backend="neuron")`` for the emulated Trainium device.

Graphs are lowered by Inductor into vectorised C++ kernels whose buffers live in NeuronCore
memory; every input signature is one static graph; compiled graphs persist in an on-disk cache
shared by processes; :func:`metrics.report` says what was compiled, loaded, or broke a graph.

The public names load on first use: ``import torch`` imports this package (its entry point
routes the default backend's neuron graphs here), and must not import Dynamo or Inductor.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "BucketCollator", "BucketPolicy", "BucketedCausalLM", "CompileOptions", "ExplicitBuckets",
    "MultipleOfBuckets", "NeuronCompileError", "PaddedBatch", "PowerOfTwoBuckets", "metrics",
    "neuron_backend", "pad_batch", "__version__",
]
__version__ = "0.1.0"

_HOMES = {
    "metrics": None,
    "NeuronCompileError": "backend", "neuron_backend": "backend",
    "BucketPolicy": "buckets", "ExplicitBuckets": "buckets", "MultipleOfBuckets": "buckets",
    "PowerOfTwoBuckets": "buckets",
    "BucketedCausalLM": "causal_lm",
    "CompileOptions": "options",
    "BucketCollator": "padding", "PaddedBatch": "padding", "pad_batch": "padding",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'neuron_compile' has no attribute {name!r}")
    home = _HOMES[name]
    value = importlib.import_module(f"neuron_compile.{home or name}")
    if home is not None:
        value = getattr(value, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
