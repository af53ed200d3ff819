"""Operators the device supports but the CPU lowering would reject while tracing.

Graphs are traced for the CPU (see ``_lowering.py``); where the CPU's meta function refuses an
input the NeuronCore accepts, the graph calls an opaque custom op instead, whose fake
implementation describes the result and whose kernel runs the ATen op on the device at run
time. Today: ``histc`` on integer tensors (MoE routers count tokens per expert with it; CUDA
and the neuron runtime support it, the CPU does not).

Flex attention is rewritten too: Inductor's CPU template for it compiles inference only, so the
lowering replaces the ``flex_attention`` operator by its dense implementation (the one eager
mode runs: the score matrix, ``score_mod`` and ``mask_mod`` applied with vmap, softmax), which
AOTAutograd then traces into ordinary ops and differentiates, so training graphs compile.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

__all__ = ["CACHEABLE_REPLACEMENTS", "replace_cpu_rejected_ops"]


@torch.library.custom_op("neuron_compile::histc", mutates_args=())
def _histc(x: torch.Tensor, bins: int = 100, min: float = 0.0, max: float = 0.0) -> torch.Tensor:  # noqa: A002
    return torch.histc(x, bins=bins, min=min, max=max)


@_histc.register_fake
def _histc_fake(x: torch.Tensor, bins: int = 100, min: float = 0.0, max: float = 0.0) -> torch.Tensor:  # noqa: A002
    return x.new_empty((bins,))


def _is_histc(node: torch.fx.Node) -> bool:
    return (node.op == "call_function" and node.target in (torch.histc, torch.ops.aten.histc.default)) or (
        node.op == "call_method" and node.target == "histc")


def _integer_input(node: torch.fx.Node) -> bool:
    source = node.args[0] if node.args else node.kwargs.get("input")
    value = source.meta.get("example_value", source.meta.get("val")) if isinstance(source, torch.fx.Node) else None
    return isinstance(value, torch.Tensor) and not value.dtype.is_floating_point


def _dense_flex_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, score_mod: Any,
                          block_mask: tuple[Any, ...], scale: float, kernel_options: dict[str, Any],
                          score_mod_other_buffers: tuple[Any, ...] = (),
                          mask_mod_other_buffers: tuple[Any, ...] = ()) -> tuple[torch.Tensor, ...]:
    """The flex attention operator's own dense implementation: (output, logsumexp, max score)."""
    from torch._higher_order_ops.flex_attention import sdpa_dense

    return sdpa_dense(query, key, value, score_mod, block_mask, scale, kernel_options,
                      score_mod_other_buffers, mask_mod_other_buffers)


# For Inductor's cache: the replacement functions' names, and what their behaviour depends on.
CACHEABLE_REPLACEMENTS = {f"{__name__}._dense_flex_attention": f"torch {torch.__version__}, dense v1"}


def _is_flex_attention(node: torch.fx.Node) -> bool:
    if node.op != "call_function":
        return False
    try:
        from torch._higher_order_ops.flex_attention import flex_attention
    except ImportError:
        return False
    return node.target is flex_attention


def replace_cpu_rejected_ops(graph: torch.fx.Graph) -> None:
    """Rewrites, in place, calls the CPU tracing would reject into device-executed custom ops."""
    for node in list(graph.nodes):
        if _is_flex_attention(node):
            node.target = _dense_flex_attention
            continue
        if _is_histc(node) and _integer_input(node):
            names = ("input", "bins", "min", "max")
            values = dict(zip(names, node.args))
            values.update(node.kwargs)
            node.target = torch.ops.neuron_compile.histc.default
            node.op = "call_function"
            node.args = (values["input"], values.get("bins", 100), float(values.get("min", 0)),
                         float(values.get("max", 0)))
            node.kwargs = {}
