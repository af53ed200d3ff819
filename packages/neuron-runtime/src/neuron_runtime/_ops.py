"""Counters of how ops ran on the emulated device."""

from __future__ import annotations

from neuron_runtime import _C

__all__ = ["get_fallback_ops", "get_float64_ops", "get_executed_ops", "reset_op_counts"]


def get_fallback_ops() -> dict[str, int]:
    """Ops whose CPU kernel produced memory outside the device, copied back (op -> count).

    The analogue of TorchNeuron's ``get_fallback_ops``: on the emulator ops normally run on
    zero-copy views of device memory, so anything listed here paid for a copy.
    """
    return dict(_C._copy_fallback_ops())


def get_float64_ops() -> dict[str, int]:
    """Ops that used float64/complex128, which Trainium hardware lacks (op -> count)."""
    return dict(_C._float64_ops())


def get_executed_ops() -> dict[str, int]:
    """Ops executed on the device (op -> count); recorded with TORCH_NEURONX_METRICS_ENABLED=1."""
    return dict(_C._zero_copy_ops())


def reset_op_counts() -> None:
    """Clears every op counter."""
    _C._reset_op_counts()
