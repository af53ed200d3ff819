"""A fresh process runs executables from the compile cache without importing Inductor's lowering.

Inductor's cache-hit path imports ``torch._inductor.graph`` (and with it every lowering module,
~2 s) and its generated programs import ``extern_kernels`` from its autotuning module (the same
modules again). Programs our code generator writes take their kernels from
``neuron_compile._runtime_support`` and are loaded with a stand-in ``torch._inductor.graph``
(:mod:`neuron_compile._output_code`), so a warm process imports neither.
"""

from __future__ import annotations

import ast
import pathlib

import pytest
import torch
import torch._inductor

from conftest import run_python_lines
from neuron_compile import _output_code, _runtime_support

_SCRIPT = """
    import os, sys, torch, torch.nn as nn
    from neuron_compile import metrics
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4)).to("neuron")
    x = torch.arange(64, dtype=torch.float32).reshape(4, 16).to("neuron") / 64
    compiled = torch.compile(model, backend="neuron")
    loss = compiled(x).square().sum()
    loss.backward()
    print("SOURCE", [r.source for r in metrics.graphs()])
    print("LOSS", repr(loss.item()))
    print("GRAD", repr(model[0].weight.grad.sum().item()))
    print("LOWERING", "torch._inductor.lowering" in sys.modules)
    print("GRAPH", "torch._inductor.graph" in sys.modules)
    print("WRAPPER_CODEGEN", "torch._inductor.codegen.wrapper" in sys.modules)
    print("DEBUG", "torch._inductor.debug" in sys.modules)
    # a graph this process compiles afterwards gets the real lowering
    n = int(os.environ["SECOND_N"])
    y = torch.arange(n, dtype=torch.float32)
    second = torch.compile(lambda a: (a * 3).cos().sum(), backend="neuron")(y.to("neuron"))
    print("SECOND", torch.allclose(second.cpu(), (y * 3).cos().sum()), metrics.graphs()[-1].source)
    print("DEBUG_REAL", torch._inductor.debug is sys.modules["torch._inductor.debug"])
    # tools reading generated code still see the programs loaded without Inductor's hook
    from torch._inductor.utils import run_and_get_code
    _, code = run_and_get_code(lambda: compiled(x))
    print("REPLAYED", len(code), all("neuron_compile._runtime_support import extern_kernels" in c for c in code))
"""


def test_a_warm_process_runs_cached_programs_without_importing_the_lowering(tmp_path):
    env = {"TORCH_NEURONX_NEFF_CACHE_DIR": str(tmp_path / "neff"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "i")}
    cold = run_python_lines(_SCRIPT, env={**env, "SECOND_N": "5"})
    warm = run_python_lines(_SCRIPT, env={**env, "SECOND_N": "7"})  # a new shape: compiled in the warm process
    assert cold["SOURCE"] == "['compiled']" and warm["SOURCE"] == "['disk']"
    assert (warm["LOSS"], warm["GRAD"]) == (cold["LOSS"], cold["GRAD"])
    assert cold["LOWERING"] == "True"
    assert warm["LOWERING"] == "False", "loading a cached program imported Inductor's lowering modules"
    assert warm["GRAPH"] == "False", "the stand-in torch._inductor.graph was left in sys.modules"
    assert warm["WRAPPER_CODEGEN"] == "False" and warm["DEBUG"] == "False"
    assert warm["DEBUG_REAL"] == "True"  # the compile imported torch._inductor.debug, replacing the stand-in
    assert warm["SECOND"] == "True compiled"
    assert warm["REPLAYED"] == cold["REPLAYED"] == "2 True"  # forward and backward, served from memory


def test_extern_kernels_resolve_to_what_inductor_registers():
    from torch._inductor.select_algorithm import extern_kernels as inductor_extern_kernels

    assert _runtime_support._TORCH_EXTERN_KERNELS <= set(vars(inductor_extern_kernels))
    for name in sorted(set(vars(inductor_extern_kernels))):
        assert getattr(_runtime_support.extern_kernels, name) is getattr(inductor_extern_kernels, name), name
    with pytest.raises(AttributeError):
        _runtime_support.extern_kernels.no_such_kernel  # noqa: B018


def test_programs_take_align_from_where_the_memory_planner_has_it():
    from torch._inductor.codegen import memory_planning
    from torch._inductor import utils

    assert memory_planning._align is utils._align


def _executed_on_import(node: ast.AST):
    """``node`` and the statements under it that run when its module is imported: not function
    bodies (they import when called, under the real module) nor ``if TYPE_CHECKING:`` blocks."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        return
    if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
        return
    yield node
    for child in ast.iter_child_nodes(node):
        yield from _executed_on_import(child)


def _binds_graph_lowering(tree: ast.Module) -> bool:
    """Whether a module imports ``torch._inductor.graph`` when it is imported."""
    return any(
        isinstance(node, ast.ImportFrom) and (
            (node.level == 1 and node.module == "graph")
            or node.module == "torch._inductor.graph"
            or (node.level == 1 and node.module is None and any(a.name == "graph" for a in node.names))
        )
        for node in _executed_on_import(tree)
    )


def test_every_inductor_module_that_imports_the_graph_module_is_known():
    root = pathlib.Path(torch._inductor.__file__).parent
    binding = set()
    for path in root.glob("*.py"):
        if _binds_graph_lowering(ast.parse(path.read_text())):
            binding.add(f"torch._inductor.{path.stem}")
    assert binding  # the scan finds the known ones (compile_fx, ...)
    assert binding <= _output_code._BINDS_GRAPH_LOWERING, binding - _output_code._BINDS_GRAPH_LOWERING


_STAND_IN_SCRIPT = """
    import sys, threading, torch
    from neuron_compile import _output_code
    with _output_code.recording(light=True) as recorded:
        graph = sys.modules["torch._inductor.graph"]
        print("STAND_IN", (graph.__doc__ or "").startswith("neuron_compile"))
        graph.GraphLowering.save_output_code("code")
    print("RECORDED", recorded)
    print("REMOVED", "torch._inductor.graph" not in sys.modules)
    # a module that binds GraphLowering when imported, first imported during a load, gets the real class
    with _output_code.recording(light=True):
        from torch._inductor.compile_fx import GraphLowering
    print("REAL_BOUND", GraphLowering.__module__, hasattr(GraphLowering, "run"))
"""

_LOCKED_SCRIPT = """
    import sys, threading, torch
    from torch._dynamo.convert_frame import compile_lock
    from neuron_compile import _output_code
    held, release = threading.Event(), threading.Event()

    def hold():
        with compile_lock:
            held.set()
            release.wait()

    threading.Thread(target=hold, daemon=True).start()
    held.wait()
    with _output_code.recording(light=True):  # another thread compiles: no stand-in, no waiting
        print("REAL", hasattr(sys.modules["torch._inductor.graph"].GraphLowering, "run"))
    release.set()
"""


def test_the_stand_in_records_sources_and_steps_aside_for_modules_that_bind_it():
    out = run_python_lines(_STAND_IN_SCRIPT)
    assert out["STAND_IN"] == "True"
    assert out["RECORDED"] == "['code']"
    assert out["REMOVED"] == "True"
    assert out["REAL_BOUND"] == "torch._inductor.graph True"


def test_no_stand_in_while_another_thread_holds_the_compile_lock():
    assert run_python_lines(_LOCKED_SCRIPT)["REAL"] == "True"


_DEFERRED_DEBUG_SCRIPT = """
    import sys, torch, torch._inductor
    from neuron_compile._output_code import defer_inductor_debug
    defer_inductor_debug()
    flags = torch._inductor.debug.RECORD_GRAPH_EXECUTION, torch._inductor.debug.GRAPH_EXECUTION_ORDER
    print("FLAGS", flags, "torch._inductor.debug" in sys.modules)
    from torch._inductor import debug  # the stand-in: other names come from the real module
    print("OTHER", callable(debug.DebugContext), "torch._inductor.debug" in sys.modules)
    import torch._inductor.debug
    print("REPLACED", torch._inductor.debug is sys.modules["torch._inductor.debug"])
    debug.RECORD_GRAPH_EXECUTION = True  # writes through to the real module
    print("WRITTEN", sys.modules["torch._inductor.debug"].RECORD_GRAPH_EXECUTION, debug.RECORD_GRAPH_EXECUTION)
"""


def test_inductor_debug_is_imported_only_when_something_needs_more_than_its_run_time_flags():
    out = run_python_lines(_DEFERRED_DEBUG_SCRIPT)
    assert out["FLAGS"] == "(False, None) False"
    assert out["OTHER"] == "True True"
    assert out["REPLACED"] == "True"
    assert out["WRITTEN"] == "True True"
