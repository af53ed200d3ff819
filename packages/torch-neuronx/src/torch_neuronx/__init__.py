"""torch_neuronx: AWS Trainium as a PyTorch device, emulated on the CPU.

``import torch_neuronx`` is what transformers, accelerate and TRL look for
(``importlib.util.find_spec("torch_neuronx")``); importing it makes sure the device is
registered (plain ``import torch`` already does, through the ``torch.backends`` entry point).
"""

from __future__ import annotations

import neuron_runtime
from neuron_runtime import get_fallback_ops, get_float64_ops, reset_op_counts
from neuron_runtime._ops import get_executed_ops
from torch_neuronx import metrics

__all__ = ["get_executed_ops", "get_fallback_ops", "get_float64_ops", "metrics", "reset_op_counts", "__version__"]
__version__ = "0.1.0"
del neuron_runtime
