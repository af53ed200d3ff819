"""neuron-runtime: AWS Trainium as a native PyTorch device, emulated on the CPU.

Importing this package (``import torch`` does, through the ``torch.backends`` entry point
``neuron_runtime._autoload``) loads the C++ runtime, renames PyTorch's PrivateUse1 backend to ``neuron`` and
registers :mod:`torch.neuron`. The device itself initialises lazily, on first use.
"""

from __future__ import annotations

import torch

from neuron_runtime._version_check import check_torch_version

check_torch_version()

from neuron_runtime import _backend  # noqa: E402  (needs the torch version checked first)
from neuron_runtime._ops import get_fallback_ops, get_float64_ops, reset_op_counts  # noqa: E402

__all__ = ["get_fallback_ops", "get_float64_ops", "reset_op_counts", "__version__"]
__version__ = "0.1.0"


_backend.register()


