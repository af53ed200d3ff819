"""Graph inputs that are lists of tensors become one input per item.

Compiled autograd hands its backward graph the saved tensors as one Python list, read in the
graph with constant-index ``getitem``. The lowering compiles flat tensor inputs (a serialisable
program takes no containers), so such a list is replaced by one placeholder per item, in the
list's place, and the caller flattens its arguments the same way.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch.fx

__all__ = ["flatten_sequence_inputs"]


class UnflattenableInput(ValueError):
    """A list input the graph uses other than by constant-index ``getitem``."""


def flatten_sequence_inputs(
    gm: torch.fx.GraphModule, inputs: Sequence[Any]
) -> tuple[torch.fx.GraphModule, Callable[[Sequence[Any]], list[Any]]]:
    """``gm`` with each list/tuple input (as long as in ``inputs``) split into its items, and
    the function that flattens a call's arguments to match."""
    positions = {i for i, value in enumerate(inputs) if isinstance(value, (list, tuple))}
    graph = copy.deepcopy(gm.graph)
    placeholders = list(graph.find_nodes(op="placeholder"))
    for position in sorted(positions):
        node = placeholders[position]
        items, anchor = [], node
        for index in range(len(inputs[position])):
            with graph.inserting_after(anchor):
                anchor = graph.placeholder(f"{node.name}_{index}")
            items.append(anchor)
        for user in list(node.users):
            index = user.args[1] if user.target is operator.getitem and len(user.args) == 2 else None
            if not isinstance(index, int) or not -len(items) <= index < len(items):
                raise UnflattenableInput(
                    f"graph input {node.name!r} (a {type(inputs[position]).__name__} of "
                    f"{len(items)} items) is used by {user.format_node()}, not only by indexing")
            items[index].meta.update(user.meta)
            user.replace_all_uses_with(items[index])
            graph.erase_node(user)
        graph.erase_node(node)
    flat_gm = torch.fx.GraphModule(gm, graph)
    flat_gm.meta.update(gm.meta)

    def flatten(args: Sequence[Any]) -> list[Any]:
        flat: list[Any] = []
        for i, value in enumerate(args):
            if i in positions:
                flat.extend(value)
            else:
                flat.append(value)
        return flat

    return flat_gm, flatten
