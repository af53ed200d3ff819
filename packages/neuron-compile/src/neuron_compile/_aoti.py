"""AOTInductor on neuron programs: a clear error instead of Inductor's ``KeyError: 'neuron'``.

AOTInductor (``torch._inductor.aoti_compile_and_package``, ``torch._inductor.aot_compile``)
writes a C++ wrapper whose runtime knows CPU, CUDA and XPU tensors only; an exported program
whose inputs or weights are on neuron failed deep inside Inductor's code generation. The
entry points now refuse such programs up front, naming what to do instead. Programs on other
devices are untouched. Armed at ``import torch`` through a post-import hook on
``torch._inductor``, so nothing is imported early.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["NEURON_AOTI_MESSAGE", "install"]

_MODULE = "torch._inductor"
_MARK = "_neuron_compile_refuses_neuron_programs"

NEURON_AOTI_MESSAGE = (
    "{entry} cannot build an AOTInductor package for the neuron device: AOTInductor's C++ "
    "runtime has no neuron backend. Export the model on the CPU (model.to('cpu') before "
    "torch.export.export) to build a CPU package, or keep it on neuron and use "
    "torch.compile(model, backend='neuron'), whose compiled graphs persist in the neuron "
    "compile cache (TORCH_NEURONX_NEFF_CACHE_DIR) and load in other processes without compiling."
)


def _is_neuron(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == "neuron"


def _exported_program_on_neuron(program: Any) -> bool:
    if not isinstance(program, torch.export.ExportedProgram):
        return False
    for node in program.graph.find_nodes(op="placeholder"):
        if _is_neuron(node.meta.get("val")):
            return True
    return any(_is_neuron(value) for value in [*program.state_dict.values(), *program.constants.values()])


def _targets_neuron(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    if args and _exported_program_on_neuron(args[0]):
        return True
    leaves = torch.utils._pytree.tree_leaves([args[1:], kwargs])
    if args and isinstance(args[0], torch.nn.Module):
        leaves += [*args[0].parameters(), *args[0].buffers()]
    return any(_is_neuron(value) for value in leaves)


def _refusing_neuron(function: Callable[..., Any], entry: str) -> Callable[..., Any]:
    @functools.wraps(function)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        if _targets_neuron(args, kwargs):
            raise NotImplementedError(NEURON_AOTI_MESSAGE.format(entry=entry))
        return function(*args, **kwargs)

    setattr(guarded, _MARK, True)
    return guarded


def _patch(module: Any) -> None:
    for name in ("aoti_compile_and_package", "aot_compile"):
        function = getattr(module, name, None)
        if function is not None and not getattr(function, _MARK, False):
            setattr(module, name, _refusing_neuron(function, f"torch._inductor.{name}"))


def install() -> None:
    """Arms the check: applied when ``torch._inductor`` is imported (now, if it is)."""
    from neuron_runtime._post_import import install_finder, register_post_import_hook

    install_finder()
    register_post_import_hook(_MODULE, _patch)
