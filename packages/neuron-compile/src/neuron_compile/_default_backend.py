"""``torch.compile``'s default backend (Inductor) on neuron tensors: the neuron compiler.

Inductor itself has no code generator for the ``neuron`` device (it fails with ``KeyError:
'neuron'``), while the neuron backend *is* Inductor targeted at the NeuronCore. So a graph that
touches neuron tensors and reaches the default backend (``torch.compile(model)``, which the
Hugging Face Trainer and many scripts call) is compiled by :func:`neuron_compile.backend.neuron_backend`,
as CUDA graphs go to Inductor's CUDA code generator; graphs on other devices are untouched.
torch.compile's modes are accepted as ``backend="neuron"`` accepts them (``reduce-overhead``'s
CUDA graphs and ``max-autotune``'s GPU autotuning do not apply: see ``neuron_compile.options``);
other Inductor options (``options=``) do not apply to the neuron compiler and are refused with an
error naming them.

Installed by the ``torch.backends`` entry point at ``import torch``; imports nothing heavy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["install"]

_MARK = "_neuron_compile_routes_neuron_graphs"
# What torch.compile's modes set (torch._inductor.list_mode_options), by the mode that sets it.
_MODE_SETTINGS = {"triton.cudagraphs": "reduce-overhead", "max_autotune": "max-autotune",
                  "coordinate_descent_tuning": "max-autotune"}


def _is_neuron(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == "neuron"


def _touches_neuron(gm: torch.fx.GraphModule, inputs: Sequence[Any]) -> bool:
    """Whether the graph takes or creates neuron tensors (Dynamo records every node's value)."""
    if any(_is_neuron(value) for value in inputs):
        return True
    for node in gm.graph.nodes:
        value = node.meta.get("example_value")
        values = value if isinstance(value, (tuple, list)) else (value,)
        if any(_is_neuron(item) for item in values):
            return True
    return False


def install() -> None:
    """Routes neuron graphs that reach Inductor's ``torch.compile`` wrapper to the neuron compiler."""
    wrapper = torch._TorchCompileInductorWrapper
    inductor_call = wrapper.__call__
    if getattr(inductor_call, _MARK, False):
        return

    def __call__(self: Any, model_: torch.fx.GraphModule, inputs_: Sequence[Any], *,
                 config_patches: dict[str, Any] | None = None) -> Any:
        if not _touches_neuron(model_, inputs_):
            return inductor_call(self, model_, inputs_, config_patches=config_patches)
        patches = {**self.config, **(config_patches or {})}
        modes = {_MODE_SETTINGS[name] for name, value in patches.items() if name in _MODE_SETTINGS and value}
        patches = {name: value for name, value in patches.items() if name not in _MODE_SETTINGS}
        if patches:
            raise ValueError(
                f"torch.compile on neuron tensors compiles with the neuron compiler, which does not take "
                f"Inductor's settings {sorted(patches)} (from mode= or options=). Call torch.compile without "
                "them, or with backend='neuron' and its own options (see neuron_compile.CompileOptions).")
        from neuron_compile.backend import neuron_backend
        from neuron_compile.options import accept_mode

        accept_mode("max-autotune" if "max-autotune" in modes else None)
        return neuron_backend(model_, list(inputs_))

    setattr(__call__, _MARK, True)
    __call__.__wrapped__ = inductor_call  # type: ignore[attr-defined]
    wrapper.__call__ = __call__  # type: ignore[method-assign]
