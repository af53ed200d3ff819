"""Tensors a Dynamo graph reads as attributes become inputs of the compiled program.

Dynamo installs some tensors on the graph module and reads them with ``get_attr`` rather than
passing them in: a compiled ``optimizer.step`` reads the parameters and the optimizer state
(neuron tensors, and the step counts, which are CPU tensors) that way, and updates them in
place. The program must work on those very tensors, every call, rather than on a copy taken
at compile time: its updates would be lost, its values baked into the program, and a program
loaded from the persistent cache would have no copy at all. So each ``get_attr`` of a tensor
is turned into a trailing placeholder, and the caller passes the attribute tensors after the
graph's own inputs. Dynamo guards such attributes by identity, so the tensors captured here
are the ones every later call of this graph sees.
"""

from __future__ import annotations

import copy
import re

import torch
import torch.fx

__all__ = ["LIFTED_PREFIX", "lift_tensor_attributes"]

LIFTED_PREFIX = "l_attr_"


def _attribute(gm: torch.fx.GraphModule, target: str) -> object:
    value: object = gm
    for part in target.split("."):
        value = getattr(value, part, None)
    return value


def lift_tensor_attributes(gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, list[torch.Tensor]]:
    """``gm`` with its tensor attributes as trailing inputs, and those tensors in order.

    Returns ``gm`` itself and an empty list when it reads no such attribute.
    """
    targets: list[str] = []
    for node in gm.graph.find_nodes(op="get_attr"):
        value = _attribute(gm, node.target)
        if isinstance(value, torch.Tensor) and node.target not in targets:
            targets.append(node.target)
    if not targets:
        return gm, []
    graph = copy.deepcopy(gm.graph)
    placeholders = graph.find_nodes(op="placeholder")
    anchor = placeholders[-1] if placeholders else None
    lifted: dict[str, torch.fx.Node] = {}
    for target in targets:
        name = LIFTED_PREFIX + re.sub(r"\W", "_", target)
        if anchor is None:
            with graph.inserting_before(next(iter(graph.nodes))):
                anchor = graph.placeholder(name)
        else:
            with graph.inserting_after(anchor):
                anchor = graph.placeholder(name)
        lifted[target] = anchor
    for node in list(graph.find_nodes(op="get_attr")):
        placeholder = lifted.get(node.target)
        if placeholder is not None:
            placeholder.meta.update(node.meta)
            node.replace_all_uses_with(placeholder)
            graph.erase_node(node)
    lifted_gm = torch.fx.GraphModule(gm, graph)
    lifted_gm.meta.update(gm.meta)
    return lifted_gm, [_attribute(gm, target) for target in targets]  # type: ignore[misc]
