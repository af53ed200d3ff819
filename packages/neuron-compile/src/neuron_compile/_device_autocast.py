"""Neuron's autocast policy, written into a graph as explicit casts before the CPU lowering.

The lowering traces graphs on CPU tensors (``_lowering.py``), where only the CPU's autocast
policy could apply. Neuron's policy differs from the CPU's (it is CUDA's: softmax, layer_norm,
sum, exp... run in float32; the CPU runs them in bfloat16), and it is the one neuron eager
applies and the one Dynamo assumed when it traced the graph. So a graph that autocast shapes
is first traced once on *neuron* fake tensors under the same autocast state: ``make_fx``
records the ATen operators with the casts autocast inserted as ordinary ``_to_copy`` calls,
and the CPU lowering then compiles that graph with autocast off.

The traced graph is traced once more for the CPU, where Inductor's decompositions may lay out
an intermediate differently (``cat`` with an empty input returns the other input's layout):
a ``view`` recorded here, valid for the layout seen here, could then be refused. So views of
values nothing mutates become ``reshape``, which views when it can and copies when it must.

Tracing below autograd drops grad-mode and inference-mode switches (``with torch.no_grad()``
inside the compiled code), which the lowering's own AOTAutograd trace needs to see what to
differentiate; they are recorded back into the traced graph as the calls Dynamo wrote.
Tensor constants the trace makes of ``torch.tensor(data)`` are rebuilt as calls in the graph
(a serialised program would otherwise expect them as inputs). A graph calling a custom
``torch.autograd.Function`` is refused (:class:`DeviceTraceUnsupported`): below autograd its
own backward would be lost; the lowering then applies the CPU's policy, with a warning.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

__all__ = ["DeviceTraceUnsupported", "uses_autocast", "with_device_casts"]

# Dynamo's spellings of an autocast region inside a graph: entry and exit calls, or a wrapping HOP.
_AUTOCAST_REGION_FUNCTIONS = frozenset({"_enter_autocast", "_exit_autocast", "wrap_with_autocast"})


def uses_autocast(gm: torch.fx.GraphModule) -> bool:
    """Whether autocast decides dtypes in ``gm``: it is compiled under an active
    ``torch.autocast("neuron")``, or enters or leaves an autocast region itself (a
    ``with torch.autocast(...)`` inside the compiled code, for any device type)."""
    if torch.is_autocast_enabled("neuron"):
        return True
    for module in gm.modules():
        if isinstance(module, torch.fx.GraphModule):
            for node in module.graph.nodes:
                if node.op == "call_function" and getattr(node.target, "__name__", "") in _AUTOCAST_REGION_FUNCTIONS:
                    return True
    return False


# Calls in Dynamo graphs that switch autograd's global state for the ops after them.
_GRAD_STATE_CALLS = (torch._C._set_grad_enabled, torch.autograd.grad_mode._enter_inference_mode,
                     torch.autograd.grad_mode._exit_inference_mode)


class _GradStateRecorder(torch.fx.Interpreter):
    """Runs a graph under ``make_fx`` and writes its grad-mode and inference-mode switches into the
    graph being traced (tracing below autograd would otherwise drop them)."""

    def __init__(self, gm: torch.fx.GraphModule, tracer: torch.fx.Tracer) -> None:
        super().__init__(gm)
        self.tracer = tracer
        self.recorded: dict[int, torch.fx.Node] = {}  # id of an inference-mode context -> its node

    def call_function(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        result = super().call_function(target, args, kwargs)
        if any(target is call for call in _GRAD_STATE_CALLS):
            node_args = tuple(self.recorded.get(id(arg), arg) for arg in args)
            node = self.tracer.create_node("call_function", target, node_args, {})
            node.meta["val"] = None
            self.recorded[id(result)] = node
        return result


def _views_of_unmutated_values_as_reshapes(graph: torch.fx.Graph) -> None:
    """Turns each ``aten.view`` whose result shares storage with no mutated value into ``reshape``.

    Values are grouped by the storage they share (a view op's result joins its input's group);
    a group any in-place or ``out=`` operator writes to keeps its views, whose aliasing the
    mutation relies on.
    """
    group: dict[torch.fx.Node, torch.fx.Node] = {}

    def root(node: torch.fx.Node) -> torch.fx.Node:
        while group.get(node, node) is not node:
            node = group[node]
        return node

    written: list[torch.fx.Node] = []
    for node in graph.nodes:
        schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
        if schema is None:
            continue
        returns_alias = any(ret.alias_info is not None and not ret.alias_info.is_write for ret in schema.returns)
        for argument, value in zip(schema.arguments, node.args):
            if argument.alias_info is None or not isinstance(value, torch.fx.Node):
                continue
            if argument.alias_info.is_write:
                written.append(value)
            elif returns_alias:
                group[root(node)] = root(value)
        for name, value in node.kwargs.items():  # out= tensors
            argument = next((arg for arg in schema.arguments if arg.name == name), None)
            if argument is not None and argument.alias_info is not None and argument.alias_info.is_write \
                    and isinstance(value, torch.fx.Node):
                written.append(value)
    mutated_groups = {root(node) for node in written}
    for node in graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.view.default \
                and root(node) not in mutated_groups:
            node.target = torch.ops.aten.reshape.default


# Higher-order operators whose meaning is lost below autograd: a torch.autograd.Function's own
# backward (``autograd_function_apply``) would give way to the derivative of its forward.
_AUTOGRAD_LEVEL_OPERATORS = frozenset({"autograd_function_apply"})

# Tensor constants the trace makes of ``torch.tensor(data)`` calls are rebuilt in the graph up to
# this many elements; a larger one is refused (the program could not be loaded from the cache).
_MAX_REBUILT_CONSTANT_ELEMENTS = 1 << 16


class DeviceTraceUnsupported(RuntimeError):
    """A graph the device trace cannot rewrite without changing what it computes."""


def _refuse_autograd_level_operators(gm: torch.fx.GraphModule) -> None:
    for module in gm.modules():
        if isinstance(module, torch.fx.GraphModule):
            for node in module.graph.nodes:
                name = getattr(node.target, "_name", None) if node.op == "call_function" else None
                if isinstance(node.target, torch._ops.HigherOrderOperator) and name in _AUTOGRAD_LEVEL_OPERATORS:
                    raise DeviceTraceUnsupported(
                        "the graph calls a torch.autograd.Function, whose own backward a trace below "
                        "autograd would replace by the derivative of its forward")


def _constants_rebuilt_in_graph(gm: torch.fx.GraphModule) -> None:
    """Replaces the tensor constants the trace attached to ``gm`` (from ``torch.tensor(data)``
    in the compiled code) by ``torch.tensor`` calls in the graph, as Dynamo had them.

    A program whose graph reads constants as attributes takes them as extra inputs once it is
    serialised: loaded from the persistent cache, it was called without them.
    """
    for node in list(gm.graph.nodes):
        if node.op != "get_attr":
            continue
        value = gm
        for part in node.target.split("."):
            value = getattr(value, part)
        if not isinstance(value, torch.Tensor):
            continue  # subgraphs of higher-order operators
        if value.numel() > _MAX_REBUILT_CONSTANT_ELEMENTS or type(value) is not torch.Tensor:
            raise DeviceTraceUnsupported(f"the trace made a tensor constant it cannot rebuild "
                                         f"({type(value).__name__} of {tuple(value.shape)})")
        data = value.detach().cpu().tolist()
        with gm.graph.inserting_before(node):
            rebuilt = gm.graph.call_function(torch.tensor, (data,), {"dtype": value.dtype, "device": value.device})
        rebuilt.meta = dict(node.meta)
        node.replace_all_uses_with(rebuilt)
        gm.graph.erase_node(node)
        if "." not in node.target:
            delattr(gm, node.target)


def _device_twin(value: Any, device: torch.device) -> Any:
    """A fake tensor like ``value`` (a fake CPU tensor) on ``device``; other values unchanged."""
    if isinstance(value, torch.Tensor):
        twin = torch.empty_strided(value.size(), value.stride(), dtype=value.dtype, device=device)
        return twin.requires_grad_(value.requires_grad)
    if isinstance(value, (list, tuple)):
        return type(value)(_device_twin(item, device) for item in value)
    return value


def with_device_casts(gm: torch.fx.GraphModule, cpu_inputs: Sequence[Any], shape_env: Any,
                      device: torch.device) -> torch.fx.GraphModule:
    """``gm`` traced to ATen operators on ``device`` under the active autocast state.

    ``cpu_inputs`` are the lowering's fake CPU inputs (with its run-time int symbols, shared
    through ``shape_env``, so that any guard this trace adds on them is seen by the lowering).
    """
    from torch._subclasses import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import get_proxy_mode, make_fx

    _refuse_autograd_level_operators(gm)

    # Constants baked into the graph are real tensors; they may meet the fake inputs here.
    fake_mode = FakeTensorMode(shape_env=shape_env, allow_non_fake_inputs=True)
    with fake_mode:
        inputs = [_device_twin(value, device) for value in cpu_inputs]

    def run(*args: Any) -> Any:
        return _GradStateRecorder(gm, get_proxy_mode().tracer).run(*args)

    # A tracing context of its own: make_fx takes the fake mode of an active one (Dynamo's, whose
    # shape environment the lowering does not share) before that of the inputs.
    context = torch._guards.TracingContext(fake_mode)
    with torch._guards.tracing(context), torch.autocast("cpu", enabled=False):  # CPU autocast: not for neuron twins
        traced = make_fx(run, tracing_mode="fake", record_module_stack=True)(*inputs)
    shape_env.pending_fresh_unbacked_symbols.clear()  # bound in the traced graph, as in gm
    _views_of_unmutated_values_as_reshapes(traced.graph)
    _constants_rebuilt_in_graph(traced)
    traced.recompile()
    return traced
