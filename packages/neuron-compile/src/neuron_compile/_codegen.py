"""Inductor code generation for the neuron device.

A NeuronCore's memory is host memory owned by the runtime's caching allocator, so the
emulated device executes exactly the kernels Inductor writes for the CPU: vectorised C++ for
fused loops, ATen's CPU kernels (through the runtime's zero-copy path) for what Inductor
leaves to ATen. What has to change is where buffers live. Graphs are therefore lowered with
Inductor's CPU scheduling and C++ code generator, and the Python wrapper that Inductor
generates around the kernels is produced by :class:`NeuronWrapperCodegen`, which binds every
buffer allocation and every ``device`` argument of the generated program to the current
NeuronCore. The result is a program whose buffers all come from the neuron allocator (counted
against the core's HBM, raising ``torch.OutOfMemoryError`` like any device allocation) and
whose inputs and outputs are neuron tensors.

Kept in one place because it is the only module that touches Inductor's codegen registry.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch._inductor.codegen import common as _codegen_common
from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen

from neuron_compile._output_code import LIGHT_PROGRAM_MARKER

__all__ = ["NeuronWrapperCodegen", "lowering_for_neuron"]

# Appended to the generated module's header: names the CPU wrapper uses for allocations and
# devices are rebound so that the program allocates on, and asks for, the current NeuronCore.
_NEURON_WRAPPER_HEADER = """
from neuron_compile._runtime_support import empty_strided_neuron as empty_strided_cpu
from neuron_compile._runtime_support import empty_strided_neuron as empty_strided_cpu_pinned
from neuron_compile._runtime_support import neuron_device as device
"""
# Inductor's header imports ``extern_kernels`` from its autotuning module, which imports every
# lowering module (~2 s in a fresh process), and ``align`` through its memory planner, which
# imports its wrapper code generator (~0.5 s); the program only calls them, so it takes the
# kernels from the runtime support module and ``align`` from where the planner has it, and
# says so (the loader relies on it: see :mod:`neuron_compile._output_code`).
_INDUCTOR_EXTERN_KERNELS = "from torch._inductor.select_algorithm import extern_kernels"
_LIGHTER_IMPORTS = {
    _INDUCTOR_EXTERN_KERNELS: "from neuron_compile._runtime_support import extern_kernels",
    "from torch._inductor.codegen.memory_planning import _align as align": "from torch._inductor.utils import _align as align",
}


class NeuronWrapperCodegen(PythonWrapperCodegen):
    """Inductor's Python wrapper, with buffers and devices bound to the current NeuronCore."""

    @staticmethod
    def create(
        is_subgraph: bool,
        subgraph_name: str | None,
        parent_wrapper: PythonWrapperCodegen | None,
        partition_signatures=None,
    ) -> PythonWrapperCodegen:
        if is_subgraph:
            # Subgraphs (control flow) are emitted into the parent module: its header applies.
            return SubgraphPythonWrapperCodegen(subgraph_name, parent_wrapper, partition_signatures)
        return NeuronWrapperCodegen()

    def write_header(self) -> None:
        super().write_header()
        lines = self.imports.get_lines_ref()
        light = _INDUCTOR_EXTERN_KERNELS in lines
        lines[:] = [_LIGHTER_IMPORTS.get(line, line) if isinstance(line, str) else line for line in lines]
        self.header.splice(_NEURON_WRAPPER_HEADER, strip=True)
        if light:
            self.header.writeline(LIGHT_PROGRAM_MARKER)


@contextlib.contextmanager
def lowering_for_neuron() -> Iterator[None]:
    """Within this context, Inductor lowers CPU graphs into programs for the neuron device.

    Dynamo compiles one frame at a time, holding its compile lock, so swapping the CPU
    wrapper generator for the duration of one compilation does not leak into other compiles.
    """
    _codegen_common.init_backend_registration()
    cpu = _codegen_common.device_codegens["cpu"]
    _codegen_common.device_codegens["cpu"] = _codegen_common.DeviceCodegen(
        cpu.scheduling, NeuronWrapperCodegen, cpu.cpp_wrapper_codegen, cpu.fx_wrapper_codegen
    )
    try:
        yield
    finally:
        _codegen_common.device_codegens["cpu"] = cpu
