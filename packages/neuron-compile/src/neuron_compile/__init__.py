"""neuron-compile: ``torch.compile(model, backend="neuron")`` for the emulated Trainium device.

Graphs are lowered by Inductor into vectorised C++ kernels whose buffers live in NeuronCore
memory; every input signature is one static graph; compiled graphs persist in an on-disk cache
shared by processes; :func:`metrics.report` says what was compiled, loaded, or broke a graph.
"""

from __future__ import annotations

from neuron_compile import metrics
from neuron_compile.backend import NeuronCompileError, neuron_backend
from neuron_compile.buckets import BucketPolicy, ExplicitBuckets, MultipleOfBuckets, PowerOfTwoBuckets
from neuron_compile.causal_lm import BucketedCausalLM
from neuron_compile.options import CompileOptions
from neuron_compile.padding import BucketCollator, PaddedBatch, pad_batch

__all__ = [
    "BucketCollator", "BucketPolicy", "BucketedCausalLM", "CompileOptions", "ExplicitBuckets",
    "MultipleOfBuckets", "NeuronCompileError", "PaddedBatch", "PowerOfTwoBuckets", "metrics",
    "neuron_backend", "pad_batch", "__version__",
]
__version__ = "0.1.0"
