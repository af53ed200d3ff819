"""Refuses to load the C++ runtime against a torch it was not built for."""

from __future__ import annotations

import torch

_REQUIRED_TORCH = "2.13"


def check_torch_version() -> None:
    """Raises ImportError naming both versions when torch does not match the build."""
    installed = torch.__version__.split("+")[0]
    if not installed.startswith(_REQUIRED_TORCH + "."):
        raise ImportError(
            f"neuron-runtime was built for torch {_REQUIRED_TORCH}.x but torch {torch.__version__} "
            "is installed; reinstall neuron-runtime against this torch, or install torch "
            f"{_REQUIRED_TORCH} (CPU build)."
        )
