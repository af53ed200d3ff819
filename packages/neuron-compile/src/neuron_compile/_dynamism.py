"""What Dynamo may turn symbolic for the neuron backend: Python ints and floats, never tensor sizes.

Trainium graphs have static shapes, so a new tensor shape is a new graph: loading the backend
keeps Dynamo's automatic dynamic shapes from making tensor sizes symbolic in the compilations
the neuron compiler does (``backend="neuron"``, and the default backend on neuron tensors,
which it routes there); other backends keep torch's default. Python ints and
floats keep torch.compile's default instead. An int that changes between calls (a step
counter, the length a sliding-window KV cache keeps in a Python int) becomes a ``SymInt``
graph input after its first change, rather than a new Dynamo trace for every value. The
backend compiles an int that only feeds computations as a run-time argument of one executable,
and specialises an int that sizes a tensor (one executable per value, like any shape). A float
that changes (a learning rate a scheduler moves, a loss scale, a sampling temperature) becomes
a 0-d float64 host tensor input after its first change, as on every backend: one executable
takes any value. ``dynamic=False`` still specialises both, as it does on every backend.

The second half reads a graph Dynamo hands over: which inputs are such ints or floats, whether
the ints size a tensor, and the bounds Dynamo's guards keep them in; and how they appear in
signatures.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch._dynamo
import torch.fx

__all__ = ["RUNTIME_INT", "IntsSpecialised", "has_symbolic_tensors", "hint", "install", "is_runtime_int_spec",
           "runtime_float_positions", "runtime_int_positions", "runtime_int_spec", "symint_positions",
           "unread_symint_positions"]

_installed = False


class IntsSpecialised(Exception):
    """The lowering guarded on a run-time int's value: the graph needs one executable per value."""


def _compiled_for_neuron(tensor: Any, tx: Any) -> bool:
    """Whether the neuron compiler gets the graph Dynamo is tracing, holding ``tensor``."""
    from neuron_compile.backend import neuron_backend

    backend = getattr(getattr(tx, "output", None), "compiler_fn", None)
    default = getattr(torch, "_TorchCompileInductorWrapper", None)
    for _ in range(6):  # Dynamo's debug wrapper, DDP's graph splitter, torch.compile's wrapper
        if backend is neuron_backend:
            return True
        if default is not None and isinstance(backend, default):
            break
        backend = (getattr(backend, "_torchdynamo_orig_backend", None) or getattr(backend, "compiler_fn", None)
                   or getattr(getattr(backend, "__self__", None), "backend_compile_fn", None))
    on_neuron = getattr(getattr(tensor, "device", None), "type", None) == "neuron"
    return on_neuron and default is not None and isinstance(backend, default)


def _static(function: Callable[..., Any]) -> Callable[..., Any]:
    """Dynamo's ``_automatic_dynamic(tensor, tx, ...)``, with automatic dynamic shapes off for the
    graphs the neuron compiler gets."""

    @functools.wraps(function)
    def run(tensor: Any, tx: Any, *args: Any, **kwargs: Any) -> Any:
        if not _compiled_for_neuron(tensor, tx):
            return function(tensor, tx, *args, **kwargs)
        with torch._dynamo.config.patch(automatic_dynamic_shapes=False):
            return function(tensor, tx, *args, **kwargs)

    return run


def install() -> None:
    """Applies the policy for the process (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    try:
        from torch._dynamo.variables import builder

        tensor_sizes = builder._automatic_dynamic
    except (ImportError, AttributeError):  # another torch: everything static, ints included
        torch._dynamo.config.automatic_dynamic_shapes = False
        return
    builder._automatic_dynamic = _static(tensor_sizes)


# -- reading the graphs Dynamo hands over ---------------------------------------------------------


def _meta_value(node: torch.fx.Node) -> Any:
    return node.meta.get("example_value", node.meta.get("val"))


def symint_positions(gm: torch.fx.GraphModule) -> dict[int, Any]:
    """Placeholder position -> symbol, for the graph's ``SymInt`` inputs (ints Dynamo made dynamic)."""
    import sympy

    positions = {}
    for position, node in enumerate(gm.graph.find_nodes(op="placeholder")):
        value = _meta_value(node)
        if isinstance(value, torch.SymInt):
            positions[position] = value.node.expr if isinstance(value.node.expr, sympy.Symbol) else None
    return positions


def unread_symint_positions(gm: torch.fx.GraphModule) -> tuple[int, ...]:
    """Positions of the graph's ``SymInt`` inputs that no node reads."""
    return tuple(position for position, node in enumerate(gm.graph.find_nodes(op="placeholder"))
                 if not node.users and isinstance(_meta_value(node), torch.SymInt))


def _sizing_symbols(gm: torch.fx.GraphModule) -> set[Any]:
    """Symbols in the sizes or strides of any tensor the graph (or a subgraph) computes.

    Storage offsets do not count: a view at an int's offset (``x[n]``) keeps static shapes.
    """
    symbols: set[Any] = set()
    for module in gm.modules():
        if isinstance(module, torch.fx.GraphModule):
            for node in module.graph.nodes:
                for item in torch.utils._pytree.tree_leaves(_meta_value(node)):
                    if isinstance(item, torch.Tensor):
                        for extent in (*item.shape, *item.stride()):
                            if isinstance(extent, torch.SymInt):
                                symbols |= extent.node.expr.free_symbols
    return symbols


def _int_bounds(value: torch.SymInt) -> tuple[int | None, int | None]:
    """The range Dynamo's guards hold an int to (``x[n]``: ``0 <= n < len``), None where unbounded."""
    from torch.utils._sympy.numbers import int_oo

    def finite(bound: Any) -> int | None:
        return None if bound in (int_oo, -int_oo) or not (bound.is_finite and bound.is_integer) else int(bound)

    known = value.node.shape_env.var_to_range.get(value.node.expr)
    return (None, None) if known is None else (finite(known.lower), finite(known.upper))


def runtime_int_positions(gm: torch.fx.GraphModule) -> dict[int, tuple[int | None, int | None]]:
    """``SymInt`` inputs that size no tensor, with their bounds: compiled as run-time arguments."""
    symints = symint_positions(gm)
    if not symints:
        return {}
    sizing = _sizing_symbols(gm)
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    return {position: _int_bounds(_meta_value(placeholders[position]))
            for position, symbol in symints.items() if symbol is not None and symbol not in sizing}


def runtime_float_positions(gm: torch.fx.GraphModule) -> frozenset[int]:
    """Inputs that are Python floats Dynamo passes as 0-d float64 host tensors (any value)."""
    positions = set()
    for position, node in enumerate(gm.graph.find_nodes(op="placeholder")):
        argument = node.meta.get("grapharg")
        if argument is not None and getattr(argument, "pass_arg_as_tensor", False) and not argument.is_tensor:
            positions.add(position)
    return frozenset(positions)


def has_symbolic_tensors(gm: torch.fx.GraphModule) -> bool:
    """Whether a tensor input has symbolic sizes (``dynamic=True``, or ``mark_dynamic``)."""
    from torch.fx.experimental.symbolic_shapes import free_symbols

    return any(isinstance(value := _meta_value(node), torch.Tensor) and free_symbols(value)
               for node in gm.graph.find_nodes(op="placeholder"))


def hint(value: Any) -> Any:
    """The example value of a ``SymInt`` Dynamo passes at compile time (read without guarding on it)."""
    if isinstance(value, torch.SymInt) and value.node.hint is not None:
        return int(value.node.hint)
    return value


# The signature entry of an int passed to the executable at run time (any value in its bounds).
RUNTIME_INT = "SymInt"


def runtime_int_spec(bounds: tuple[int | None, int | None]) -> str:
    lower, upper = bounds
    return f"{RUNTIME_INT}[{'' if lower is None else lower}:{'' if upper is None else upper}]"


def is_runtime_int_spec(spec: Any) -> bool:
    return isinstance(spec, str) and spec.startswith(RUNTIME_INT + "[")
