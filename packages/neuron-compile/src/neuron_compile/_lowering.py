"""Lowering one Dynamo graph for one set of concrete input shapes into a neuron executable.

Steps, each kept small:

1. The graph is copied with every ``neuron`` device argument replaced by ``cpu`` and its
   example inputs replaced by fake CPU tensors of the same sizes, strides and dtypes: Inductor
   then runs its CPU pipeline unchanged (decompositions, AOTAutograd's forward/backward
   partition, fusion, vectorised C++ kernels).
2. A graph that autocast shapes is first traced on neuron fake tensors under the active
   autocast state (:mod:`neuron_compile._device_autocast`), so that neuron's cast policy, not
   the CPU's, is written into it as explicit casts; the CPU tracing then runs with autocast off.
3. :func:`neuron_compile._codegen.lowering_for_neuron` makes the generated program allocate
   on, and run against, the current NeuronCore.
4. ``torch._inductor.standalone_compile(..., aot=True)`` produces a self-contained serialisable
   artifact (forward and backward); the C++ kernel binaries it built are collected so that a
   fresh process can load the executable without invoking the C++ compiler.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.fx
from torch._inductor import codecache as _codecache
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch._inductor.runtime.cache_dir_utils import cache_dir as _inductor_cache_dir
from torch._subclasses import FakeTensorMode
from torch.utils._python_dispatch import is_traceable_wrapper_subclass
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from neuron_compile import _header_names, _isa_probes
from neuron_compile._codegen import lowering_for_neuron
from neuron_compile._device_autocast import uses_autocast, with_device_casts
from neuron_compile._dynamism import IntsSpecialised
from neuron_compile._device_ops import CACHEABLE_REPLACEMENTS, replace_cpu_rejected_ops
from neuron_compile.executable import NeuronExecutable

__all__ = ["LoweredGraph", "lower_graph"]

_isa_probes.install_recorder()  # before this process's first kernel build probes the CPU
_header_names.install_recorder()  # ... and names its precompiled header


@dataclasses.dataclass(frozen=True)
class LoweredGraph:
    """A compiled graph: callable now, and serialisable unless ``not_serialisable`` says why."""

    run: Callable[..., Any]
    executable: NeuronExecutable | None
    not_serialisable: str = ""


class _NeuronLoweringMarker(CustomGraphPass):
    """A no-op post-grad pass whose only effect is its uuid in Inductor's cache keys.

    Graphs lowered for neuron look like CPU graphs to Inductor; this keeps Inductor's own
    in-process and on-disk caches from handing a neuron program to a CPU compile or back.
    """

    def __call__(self, graph: torch.fx.Graph) -> None:
        return None

    def uuid(self) -> str:
        return "torch-neuronx-lowering-v1"


def _cpu_for_neuron(value: Any) -> Any:
    if isinstance(value, torch.device) and value.type == "neuron":
        return torch.device("cpu")
    if isinstance(value, str) and (value == "neuron" or value.startswith("neuron:")):
        return "cpu"
    return value


def _is_stream_bookkeeping(node: torch.fx.Node) -> bool:
    """Dynamo's record of stream and event use (``with stream:``, ``event.record()``): the
    stream and event objects it fetches and the ``torch.ops.streams`` ops on them."""
    target = node.target
    if getattr(target, "__name__", "") == "get_external_object_by_index":
        return True
    name = getattr(target, "_qualified_op_name", None) or getattr(getattr(target, "_schema", None), "name", "")
    return str(name).startswith("streams::")


def _drop_stream_bookkeeping(graph: torch.fx.Graph) -> None:
    """Streams run in order on the host (every stream is always complete), so a graph's stream
    switches and event records change nothing it computes; Inductor's CPU code generation cannot
    emit them (the program failed at run time naming an undefined stream or input)."""
    for node in reversed(list(graph.nodes)):
        if node.op == "call_function" and _is_stream_bookkeeping(node) and not node.users:
            graph.erase_node(node)
            continue
        custom = node.meta.get("custom")
        if isinstance(custom, dict) and "stream" in custom:  # ops Dynamo saw under `with stream:`
            node.meta["custom"] = {key: value for key, value in custom.items() if key != "stream"}


def _prepared_for_tracing(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of ``gm`` without the calls a CPU tracing rejects or cannot emit."""
    graph = copy.deepcopy(gm.graph)
    replace_cpu_rejected_ops(graph)
    _drop_stream_bookkeeping(graph)
    return torch.fx.GraphModule(gm, graph)


def _graph_for_cpu_lowering(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of ``gm`` whose device arguments name ``cpu``."""
    graph = _prepared_for_tracing(gm).graph
    for node in graph.nodes:
        node.args = torch.fx.node.map_aggregate(node.args, _cpu_for_neuron)
        node.kwargs = torch.fx.node.map_aggregate(node.kwargs, _cpu_for_neuron)
    lowered = torch.fx.GraphModule(gm, graph)
    for node in graph.nodes:  # constants baked into the graph are read on the host side
        if node.op == "get_attr":
            value = getattr(lowered, node.target, None)
            if isinstance(value, torch.Tensor) and value.device.type == "neuron":
                setattr(lowered, node.target, value.detach().cpu())
    for name, submodule in lowered.named_children():  # control-flow subgraphs
        if isinstance(submodule, torch.fx.GraphModule):
            setattr(lowered, name, _graph_for_cpu_lowering(submodule))
    lowered.recompile()
    return lowered


def _shape_env_after(gm: torch.fx.GraphModule) -> ShapeEnv:
    """A fresh shape environment that already has the data-dependent sizes ``gm`` binds.

    Dynamo's graph names the sizes it read from data (``x.item()``, ``nonzero``; with
    ``capture_scalar_outputs``) ``u0``, ``u1``... in each node's ``unbacked_bindings``.
    AOTAutograd traces the graph again in the lowering's own environment and renames each new
    symbol to the graph's, which must exist there and must not be the new symbol's own name (a
    fresh environment numbered from ``u0`` again: "u0 possible memo disaster").
    """
    from torch.utils._sympy.symbol import SymT, symbol_is_type

    shape_env = ShapeEnv()
    counts = {SymT.UNBACKED_INT: 0, SymT.UNBACKED_FLOAT: 0}
    for module in gm.modules():
        if isinstance(module, torch.fx.GraphModule):
            for node in module.graph.nodes:
                for symbol in node.meta.get("unbacked_bindings") or {}:
                    for kind in counts:
                        if symbol_is_type(symbol, kind):
                            digits = str(symbol)[len(str(symbol).rstrip("0123456789")):]
                            counts[kind] = max(counts[kind], int(digits) + 1 if digits else 0)
    for _ in range(counts[SymT.UNBACKED_INT]):
        shape_env.create_unbacked_symint()
    for _ in range(counts[SymT.UNBACKED_FLOAT]):
        shape_env.create_unbacked_symfloat()
    shape_env.pending_fresh_unbacked_symbols.clear()  # bound by the graph, not by a new trace
    return shape_env


class UnsupportedGraphInput(TypeError):
    """A graph input the lowering cannot take (a tensor subclass such as DTensor, which the backend
    desugars through AOTAutograd before it reaches the lowering)."""


def _runtime_int(value: int, position: int, bounds: tuple[int | None, int | None],
                 shape_env: ShapeEnv) -> torch.SymInt:
    """A fresh symbol for the int at ``position``, which the program takes at run time.

    ``bounds`` are the range Dynamo's guards hold the int to on every call (``None``: unbounded),
    so the lowering need not guard on them again (``x[n]`` is in range).
    """
    from torch._dynamo.source import LocalSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic
    from torch.utils._sympy.numbers import int_oo

    symint = shape_env.create_unspecified_symint_and_symbol(
        int(value), source=LocalSource(f"runtime_int_{position}"), dynamic_dim=DimDynamic.DYNAMIC)
    lower, upper = bounds
    if lower is not None or upper is not None:
        shape_env.constrain_symbol_range(symint.node.expr, -int_oo if lower is None else lower,
                                         int_oo if upper is None else upper)
    return symint


def _check_ints_unspecialised(shape_env: ShapeEnv, ints: Sequence[Any]) -> None:
    """Raises :class:`IntsSpecialised` if compiling guarded on (or fixed) a run-time int's value."""
    symbols = {value.node.expr for value in ints}
    fixed = symbols & set(shape_env.replacements)
    guarded = [guard.expr for guard in shape_env.guards if guard.expr.free_symbols & symbols]
    if fixed or guarded:
        raise IntsSpecialised(f"the lowering depends on the value of {sorted(map(str, fixed | symbols))}: "
                              f"{[str(expr) for expr in guarded]}")


def _fake_cpu_inputs(example_inputs: Sequence[Any], fake_mode: FakeTensorMode,
                     runtime_ints: Mapping[int, tuple[int | None, int | None]] | None = None) -> list[Any]:
    for position, value in enumerate(example_inputs):
        if is_traceable_wrapper_subclass(value):
            raise UnsupportedGraphInput(
                f"graph input {position} is a {type(value).__name__}: the lowering takes plain tensors; "
                "compile through the 'neuron' backend, which desugars tensor subclasses (DTensor) first")
    def fake(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            cpu = torch.empty_strided(value.size(), value.stride(), dtype=value.dtype, device="cpu")
            return cpu.requires_grad_(value.requires_grad)
        if isinstance(value, (list, tuple)):  # compiled autograd's list of saved tensors
            return type(value)(fake(item) for item in value)
        return value

    with fake_mode:
        runtime_ints = runtime_ints or {}
        return [_runtime_int(value, position, runtime_ints[position], fake_mode.shape_env)
                if position in runtime_ints else fake(value) for position, value in enumerate(example_inputs)]


@contextlib.contextmanager
def _without_autocast() -> Iterator[None]:
    """The CPU tracing of the lowering, with neither the device's nor the CPU's autocast active."""
    with torch.autocast("neuron", enabled=False), torch.autocast("cpu", enabled=False):
        yield


@contextlib.contextmanager
def _cpu_autocast_for_device() -> Iterator[None]:
    """The fallback when the device trace fails: the active ``neuron`` autocast state applied to
    the CPU tracing, with the CPU's policy (autocast regions in the graph already name ``cpu``)."""
    enabled = torch.is_autocast_enabled("neuron")
    dtype = torch.get_autocast_dtype("neuron")
    with torch.autocast("neuron", enabled=False), torch.autocast("cpu", dtype=dtype, enabled=enabled):
        yield


@contextlib.contextmanager
def _recording_kernel_sources() -> Iterator[list[str]]:
    """Collects the paths of the C++ sources Inductor writes (or finds) while compiling."""
    written: list[str] = []
    original = _codecache.write

    def recording_write(content: Any, extension: str, *args: Any, **kwargs: Any) -> tuple[str, str]:
        key, path = original(content, extension, *args, **kwargs)
        if extension == "main.cpp":
            written.append(path)
        return key, path

    _codecache.write = recording_write
    try:
        yield written
    finally:
        _codecache.write = original


def _kernel_binaries(source_paths: Sequence[str]) -> dict[str, bytes]:
    """The shared objects built from ``source_paths``, keyed by path in Inductor's cache."""
    root = _inductor_cache_dir()
    binaries: dict[str, bytes] = {}
    for source in source_paths:
        binary = source[: -len(".cpp")] + ".so"
        if os.path.exists(binary):
            with open(binary, "rb") as handle:
                binaries[os.path.relpath(binary, root)] = handle.read()
    return binaries


def _isa_probe_binaries() -> tuple[dict[str, bytes], dict[str, bool]]:
    """Inductor's vector-ISA probe libraries, keyed like kernels, and whether each one loaded.

    Before it loads any kernel, Inductor decides the vector ISA by building a probe library per
    candidate ISA into its cache (two g++ runs, ~5 s here) and loading each in a child process
    (~0.3 s each). Shipping the libraries with the executable lets a process with an empty
    Inductor cache load it without any compiler run; shipping the outcomes this process recorded
    (:mod:`neuron_compile._isa_probes`) lets it skip the child processes on the same CPU.
    Best effort: a torch whose probe internals differ just ships none.
    """
    root = _inductor_cache_dir()
    outcomes = _isa_probes.recorded_outcomes()
    paths = set(outcomes)
    try:
        from torch._inductor import cpu_vec_isa
        from torch._inductor.codecache import write
        from torch._inductor.cpp_builder import CppBuilder, CppTorchOptions

        for isa in cpu_vec_isa.supported_vec_isa_list:
            fingerprint = cpu_vec_isa._get_isa_dry_compile_fingerprint(isa.build_arch_flags())
            key, source = write(cpu_vec_isa.VecISA._avx_code, "cpp", extra=fingerprint)
            options = CppTorchOptions(vec_isa=isa, warning_all=False)
            binary = CppBuilder(key, [source], options, os.path.dirname(source)).get_target_file_path()
            paths.add(os.path.relpath(binary, root))
    except Exception:  # noqa: BLE001 - an optimisation of the load, never a reason to fail a compile
        pass
    binaries: dict[str, bytes] = {}
    for relative in sorted(paths):
        path = os.path.join(root, relative)
        if os.path.isfile(path):
            with open(path, "rb") as handle:
                binaries[relative] = handle.read()
    return binaries, {path: outcome for path, outcome in outcomes.items() if path in binaries}


def _serialisability_problem(gm: torch.fx.GraphModule) -> str:
    from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache, check_cacheable

    try:
        check_cacheable(gm)
    except BypassAOTAutogradCache as reason:
        return str(reason).strip().splitlines()[0]
    except Exception as error:  # the check itself is best effort
        return f"{type(error).__name__}: {error}"
    return "Inductor produced no serialisable artifact"


def _device_of(example_inputs: Sequence[Any]) -> torch.device:
    """The NeuronCore the graph's inputs are on (the current one if it has no neuron tensor)."""
    for value in torch.utils._pytree.tree_leaves(list(example_inputs)):
        if isinstance(value, torch.Tensor) and value.device.type == "neuron":
            return value.device
    return torch.device("neuron", torch.neuron.current_device())


def lower_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                runtime_ints: Mapping[int, tuple[int | None, int | None]] | None = None,
                apply_autocast: bool = True) -> LoweredGraph:
    """Compiles ``gm`` for exactly the shapes of ``example_inputs`` into a neuron executable.

    The ints at ``runtime_ints`` (positions in ``example_inputs``, with their bounds) stay
    symbolic: the program takes them as arguments, for any value in bounds;
    :class:`IntsSpecialised` is raised if compiling had to depend on their values after all. A
    graph AOTAutograd cannot serialise (a rare construct, such as an opaque Python callable)
    still compiles and runs; it is simply not written to the persistent cache.
    ``apply_autocast=False`` is for graphs already traced on the device under autocast (the
    plain graphs AOTAutograd makes of tensor-subclass graphs): their casts are all explicit.
    """
    def fake_inputs() -> tuple[FakeTensorMode, list[Any]]:
        mode = FakeTensorMode(shape_env=_shape_env_after(gm))
        return mode, _fake_cpu_inputs(example_inputs, mode, runtime_ints)

    fake_mode, inputs = fake_inputs()
    autocast = _without_autocast()
    if apply_autocast and uses_autocast(gm):
        try:
            gm = with_device_casts(_prepared_for_tracing(gm), inputs, fake_mode.shape_env, _device_of(example_inputs))
        except Exception as error:  # noqa: BLE001 - the CPU's policy still compiles the graph
            warnings.warn(
                f"the neuron compiler could not trace this graph on the device under autocast "
                f"({type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:300]}); it applies "
                "the CPU's autocast policy to it instead, whose dtypes can differ from neuron eager's "
                "(softmax, layer_norm, sum... in the low precision dtype)", RuntimeWarning, stacklevel=4)
            fake_mode, inputs = fake_inputs()  # free of the failed trace's symbols
            autocast = _cpu_autocast_for_device()
    lowered = _graph_for_cpu_lowering(gm)
    options = {"config_patches": {
        "post_grad_custom_post_pass": _NeuronLoweringMarker(),
        # Functions the graph rewrites introduce are as cacheable as the operators they replace.
        "unsafe_marked_cacheable_functions": {
            **torch._inductor.config.unsafe_marked_cacheable_functions, **CACHEABLE_REPLACEMENTS},
    }}
    with _recording_kernel_sources() as sources, autocast, lowering_for_neuron():
        artifact = torch._inductor.standalone_compile(
            lowered, inputs, dynamic_shapes="from_example_inputs", options=options, aot=True,
            fake_mode=fake_mode,
        )
    _check_ints_unspecialised(fake_mode.shape_env, [inputs[position] for position in sorted(runtime_ints or {})])
    try:
        program = artifact.serialize()
    except (TypeError, AttributeError, RuntimeError):
        return LoweredGraph(artifact, None, _serialisability_problem(lowered))
    support, probe_outcomes = _isa_probe_binaries()
    header_names = _header_names.recorded_names()
    executable = NeuronExecutable(program=program, kernels=_kernel_binaries(sources), support=support,
                                  isa_probes=probe_outcomes, header_names=header_names,
                                  cpu=_isa_probes.cpu_fingerprint() if probe_outcomes or header_names else "")
    return LoweredGraph(artifact, executable)
