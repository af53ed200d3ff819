"""Registers the neuron device with torch (idempotent)."""

from __future__ import annotations

import warnings

import torch

from neuron_runtime import _C
from neuron_runtime._config import load_config

_registered = False


def register() -> None:
    """Configures the C++ runtime from the environment and makes ``neuron`` a torch device."""
    global _registered
    if _registered:
        return
    _registered = True
    config = load_config()
    _C._configure(
        config.profile.name,
        config.device_count,
        config.capacity_bytes,
        config.initial_device,
        {"allow": 0, "warn": 1, "error": 2}[config.float64_policy],
        config.error,
        not config.autograd_device_threads,
    )
    _C._set_op_metrics_enabled(config.metrics_enabled)
    if config.warning:
        warnings.warn(config.warning, RuntimeWarning, stacklevel=2)
    if torch._C._get_privateuse1_backend_name() != "neuron":
        torch.utils.rename_privateuse1_backend("neuron")
    from neuron_runtime import neuron as device_module

    device_module._config = config
    torch._register_device_module("neuron", device_module)
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
    )
    from neuron_runtime import (
        _dlpack, _flex_attention, _higher_order_autocast, _jagged_attention, _multiprocessing, _printing,
        _transformer_encoder,
    )

    _printing.install()
    _dlpack.install()
    _multiprocessing.install()
    _transformer_encoder.install()
    _flex_attention.install()
    _jagged_attention.install()
    _higher_order_autocast.install()

