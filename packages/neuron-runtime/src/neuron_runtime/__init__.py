"""neuron-runtime: AWS Trainium as a native PyTorch device, emulated on the CPU.

Importing this package (which ``import torch`` does through the ``torch.backends`` entry
point) loads the C++ runtime, renames PyTorch's PrivateUse1 backend to ``neuron`` and
registers :mod:`torch.neuron`. The device itself initialises lazily, on first use.
"""

from __future__ import annotations

import torch

from neuron_runtime._version_check import check_torch_version

check_torch_version()

from neuron_runtime import _C  # noqa: E402  (needs the torch version checked first)
from neuron_runtime._config import load_config  # noqa: E402
from neuron_runtime._ops import get_fallback_ops, get_float64_ops, reset_op_counts  # noqa: E402

__all__ = ["get_fallback_ops", "get_float64_ops", "reset_op_counts", "__version__"]
__version__ = "0.1.0"


def _register() -> None:
    config = load_config()
    _C._configure(
        config.profile.name,
        config.profile.core_name,
        config.device_count,
        config.capacity_bytes,
        config.initial_device,
        list(config.visible_cores),
        {"allow": 0, "warn": 1, "error": 2}[config.float64_policy],
        config.error,
    )
    _C._set_op_metrics_enabled(config.metrics_enabled)
    if torch._C._get_privateuse1_backend_name() != "neuron":
        torch.utils.rename_privateuse1_backend("neuron")
    from neuron_runtime import neuron as device_module

    device_module._config = config
    torch._register_device_module("neuron", device_module)
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
    )


_register()


def _autoload() -> None:
    """Entry point of the ``torch.backends`` group: importing this module is the work."""
