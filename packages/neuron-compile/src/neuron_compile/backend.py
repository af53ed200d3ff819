"""The ``neuron`` backend of ``torch.compile``, registered through the ``torch_dynamo_backends``
entry point (installing the package is enough: ``torch.compile(model, backend="neuron")``).

Static shapes, as on Trainium: every distinct input signature (sizes, strides, dtypes) is one
graph with its own executable, counted in :mod:`neuron_compile.metrics`. A graph Dynamo hands
over with symbolic sizes, because of ``dynamic=True`` or Dynamo's automatic dynamic shapes, is
not compiled symbolically: it is compiled once per concrete signature it is called with (the
documented coercion of ``dynamic=True``, announced by one warning). Loading the backend keeps
Dynamo's automatic dynamic shapes off tensor sizes for the process, and raises its recompile
limit to 64, so that a bucket policy's graphs (16 with the default) all fit. Python ints that
change between calls still become ``SymInt`` inputs, as on other backends; one that only feeds
computations is an argument of a single executable (see :mod:`neuron_compile._dynamism`).

Executables come from, in order: this process's memory, the persistent compile cache
(:mod:`neuron_compile.cache`), or the compiler (:mod:`neuron_compile._lowering`). A graph the
compiler cannot handle raises :class:`NeuronCompileError` naming the operator, unless the
``fallback_to_eager`` option asks to run that graph eagerly.
"""

from __future__ import annotations

import dataclasses
import hashlib
import platform
import re
import sys
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch._dynamo
import torch.fx
from torch.utils._python_dispatch import _disable_current_modes

from neuron_compile import _diagnostics, _dynamism, _output_code, metrics
from neuron_compile._autoload import arm_torch_patches
from neuron_compile._dynamism import (
    RUNTIME_INT,
    IntsSpecialised,
    has_symbolic_tensors,
    hint,
    is_runtime_int_spec,
    runtime_float_positions,
    runtime_int_positions,
    runtime_int_spec,
    symint_positions,
    unread_symint_positions,
)
from neuron_compile._graph_attributes import LIFTED_PREFIX, lift_tensor_attributes
from neuron_compile._sequence_inputs import flatten_sequence_inputs
from neuron_compile.executable import NeuronExecutable
from neuron_compile.options import CompileOptions

__all__ = ["neuron_backend", "NeuronCompileError"]

__version__ = "0.1.0"

# Bumped whenever the same graph starts lowering to a different program, so that persistent cache
# entries written before are not reused (2: autocast graphs traced on the device, neuron's policy).
_LOWERING_REVISION = 2

# One graph per bucket must fit under Dynamo's recompile limit (default 8).
_MIN_RECOMPILE_LIMIT = 64
if torch._dynamo.config.recompile_limit < _MIN_RECOMPILE_LIMIT:
    torch._dynamo.config.recompile_limit = _MIN_RECOMPILE_LIMIT
# Static shapes: a new tensor shape is a recompile for that shape, never a symbolic graph that
# would then be compiled again for shapes it had already seen; changing Python ints and floats become
# run-time arguments (neuron_compile._dynamism). Process-wide: Dynamo has no per-backend setting.
_dynamism.install()
# Normally armed at `import torch`; again here for processes with torch's autoload turned off.
arm_torch_patches()


class NeuronCompileError(RuntimeError):
    """The neuron compiler could not compile a graph."""


_memory_lock = threading.Lock()


@dataclasses.dataclass(frozen=True)
class _HeldExecutable:
    """An executable this process holds, with what replaying a hit on it reports to Inductor."""

    run: Callable[..., Any]
    kernels: int  # kernel binaries (the metrics report)
    inductor_kernels: int  # kernels Inductor counted generating or loading it
    output_code: tuple[str, ...]  # the sources Inductor reported for it


_loaded: dict[str, _HeldExecutable] = {}


def _inductor_kernel_count() -> int:
    """Inductor's process-wide count of generated kernels (tests and tools read it), if loaded."""
    inductor_metrics = sys.modules.get("torch._inductor.metrics")
    return getattr(inductor_metrics, "generated_kernel_count", 0) if inductor_metrics else 0


def _count_inductor_kernels(count: int) -> None:
    """Replays ``count`` on Inductor's counter, as Inductor's own cache hits do."""
    inductor_metrics = sys.modules.get("torch._inductor.metrics")
    if inductor_metrics is not None and count:
        inductor_metrics.generated_kernel_count += count


_warned_dynamic = False


def _function_name() -> tuple[str, str]:
    """(readable name, identity) of the function Dynamo is compiling."""
    from torch._guards import CompileContext, TracingContext

    context = TracingContext.try_get()
    code = context.traced_code[0] if context is not None and context.traced_code else None
    name = code.co_name if code is not None else "graph"
    compile_id = CompileContext.current_compile_id()
    frame = str(compile_id.frame_id) if compile_id is not None else name
    suffix = f"[{compile_id}]" if compile_id is not None else ""
    return f"{name}{suffix}", f"{name}:{frame}"


def _input_spec(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return [list(value.shape), list(value.stride()), str(value.dtype).removeprefix("torch."),
                value.device.type, bool(value.requires_grad)]
    if isinstance(value, (bool, int, float, str, type(None))):
        return value
    if isinstance(value, (list, tuple)):  # compiled autograd passes its saved tensors as one list
        return {type(value).__name__: [_input_spec(item) for item in value]}
    return type(value).__qualname__


def _is_module_state(placeholder: str) -> bool:
    return placeholder.startswith(("l_self_", "L_self_", LIFTED_PREFIX))


_SHOWN_INPUTS = 12
_SIZE_SYMBOL = re.compile(r"s\d+$")  # Dynamo's placeholders for symbolic tensor sizes (dynamic=True)


def _is_int_argument(name: str, spec: Any) -> bool:
    """A specialised int the caller passed (not module state, not a tensor's symbolic size)."""
    return type(spec) is int and not _is_module_state(name) and not _SIZE_SYMBOL.match(name)


def _signature_text(placeholders: Sequence[str], specs: Sequence[Any], floats: frozenset[int] = frozenset()) -> str:
    """``input_ids=4x128 labels=4x128 (+22 parameters)``: the inputs a reader recognises.

    Ints show their value, or ``int`` when the executable takes any value at run time; the
    ``floats`` positions (Python floats passed at run time) show as ``float``.
    """
    from neuron_compile._diagnostics import readable_input_name

    shown, state = [], 0
    for position, (name, spec) in enumerate(zip(placeholders, specs)):
        if position in floats:
            shown.append(f"{readable_input_name(name)}=float")
            continue
        if is_runtime_int_spec(spec) or _is_int_argument(name, spec):  # sizes show as tensors' shapes
            shown.append(f"{readable_input_name(name)}={'int' if is_runtime_int_spec(spec) else spec}")
            continue
        if not isinstance(spec, list):
            continue
        if _is_module_state(name):
            state += 1
        else:
            shown.append(f"{readable_input_name(name)}={'x'.join(map(str, spec[0])) or 'scalar'}")
    if len(shown) > _SHOWN_INPUTS:  # AOTAutograd's backward graphs take dozens of saved activations
        shown = shown[:_SHOWN_INPUTS] + [f"... {len(shown) - _SHOWN_INPUTS} more"]
    return " ".join(shown) + (f" (+{state} parameters/buffers)" if state else "")


def _graph_text(gm: torch.fx.GraphModule) -> str:
    """The graph's code (with control-flow subgraphs and constants), without source comments."""
    parts = []
    for name, module in gm.named_modules():
        if isinstance(module, torch.fx.GraphModule):
            code = "\n".join(line for line in module.code.splitlines()
                             if line.strip() and not line.lstrip().startswith("#"))
            parts.append(f"{name}:\n{code}")
    for node in gm.graph.find_nodes(op="get_attr"):
        value = getattr(gm, node.target, None)
        if isinstance(value, torch.Tensor):
            parts.append(f"{node.target}={_input_spec(value)}:{_tensor_digest(value)}")
    return "\n".join(parts)


def _tensor_digest(value: torch.Tensor) -> str:
    """A digest of a constant's values (control-flow subgraphs keep their constants; 0-d ones too)."""
    if value.is_meta or value.layout != torch.strided:
        return "no-data" if value.is_meta else f"{value.layout}:{id(value)}"  # never shared
    data = value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(data).hexdigest()


def _cache_key(graph_text: str, specs: list[Any], options: CompileOptions) -> str:
    import neuron_runtime
    from neuron_compile.cache import make_key

    import torch._functorch.config
    import torch._inductor.config

    autocast = (torch.is_autocast_enabled("neuron"), str(torch.get_autocast_dtype("neuron")))
    return make_key({
        "graph": graph_text,
        "inputs": specs,
        "grad_enabled": torch.is_grad_enabled(),
        "autocast": list(autocast),
        "options": {"fallback_to_eager": options.fallback_to_eager},
        # Inductor's and AOTAutograd's settings change the program (fallback_random, freezing,
        # cpp.simdlen, ...): keyed as Inductor keys its own cache, on the hash of every setting
        # that is not marked compile-ignored (cached by torch until a setting changes).
        "inductor_config": torch._inductor.config.get_hash().hex(),
        "functorch_config": torch._functorch.config.get_hash().hex(),
        "deterministic": [torch.are_deterministic_algorithms_enabled(),
                          torch.is_deterministic_algorithms_warn_only_enabled(),
                          torch.utils.deterministic.fill_uninitialized_memory],
        "versions": {"torch": torch.__version__, "neuron_compile": __version__,
                     "neuron_runtime": neuron_runtime.__version__, "lowering": _LOWERING_REVISION},
        # Kernels are built for this CPU's vector ISA. torch's own capability probe is free;
        # Inductor's (pick_vec_isa) compiles test programs, seconds on a fresh machine.
        "cpu_isa": f"{platform.machine()}:{torch.backends.cpu.get_cpu_capability()}",
    })


def _failing_operator(error: BaseException) -> str | None:
    """The operator Inductor names in a lowering failure (``target: aten.foo.default``)."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        found = re.search(r"target: (\S+)", str(current))
        if found:
            return found.group(1)
        pending += [current.__cause__, current.__context__, getattr(current, "inner_exception", None)]
    return None


def _on_core(executable: Callable[..., Any], index: int) -> Callable[..., Any]:
    """Runs ``executable`` with ``index`` as the current core (its buffers are allocated there)."""
    current_device = torch.neuron.current_device
    set_device = torch.neuron.set_device

    def run(*args: Any) -> Any:
        previous = current_device()
        if previous == index:
            return executable(*args)
        set_device(index)
        try:
            return executable(*args)
        finally:
            set_device(previous)

    return run


def _with_kernel_count(executable: Callable[..., Any], kernels: int) -> Callable[..., Any]:
    run = lambda *args: executable(*args)  # noqa: E731
    run._neuron_kernels = kernels  # type: ignore[attr-defined]
    return run


def _loaded_executable(executable: NeuronExecutable) -> Callable[..., Any]:
    return _with_kernel_count(executable.load(), len(executable.kernels))


def _forget_compiled() -> None:
    """Drops this process's in-memory executables (tests; ``torch._dynamo.reset`` keeps them)."""
    global _warned_dynamic
    with _memory_lock:
        _loaded.clear()
    _warned_dynamic = False
    _diagnostics._reset()


def _device_index(example_inputs: Sequence[Any]) -> int:
    for value in torch.utils._pytree.tree_leaves(list(example_inputs)):
        if isinstance(value, torch.Tensor) and value.device.type == "neuron":
            return value.device.index if value.device.index is not None else torch.neuron.current_device()
    return torch.neuron.current_device()


def _host_output_positions(gm: torch.fx.GraphModule) -> list[int]:
    """Outputs the graph computes as CPU tensors (``.cpu()`` in the compiled code)."""
    positions = []
    for output in gm.graph.find_nodes(op="output"):
        results = output.args[0] if isinstance(output.args[0], (tuple, list)) else (output.args[0],)
        for position, node in enumerate(results):
            value = node.meta.get("example_value", node.meta.get("val")) if isinstance(node, torch.fx.Node) else None
            if isinstance(value, torch.Tensor) and value.device.type == "cpu":
                positions.append(position)
    return positions


def _returning_host_outputs(executable: Callable[..., Any], positions: list[int]) -> Callable[..., Any]:
    """``executable`` with the outputs at ``positions`` moved to the host, where the graph put them.

    The lowering allocates every buffer on the device (neuron memory is host memory, so the
    kernels run alike); an output the graph computes on the CPU must still come back as a CPU
    tensor, as a copy, as eager ``.cpu()`` makes one.
    """
    def run(*args: Any) -> Any:
        outputs = executable(*args)
        moved = list(outputs)
        for position in positions:
            value = moved[position]
            if isinstance(value, torch.Tensor) and value.device.type == "neuron":
                moved[position] = value.cpu()
        return type(outputs)(moved) if isinstance(outputs, tuple) else moved

    return run


def _is_nested_int(value: Any) -> bool:
    return isinstance(value, torch.SymInt) and value.node.is_nested_int()


def _with_zeros(values: Sequence[Any], positions: Sequence[int]) -> list[Any]:
    replaced = list(values)
    for position in positions:
        replaced[position] = 0
    return replaced


class _NeuronGraph:
    """One Dynamo graph and its executables, one per concrete input signature."""

    def __init__(self, gm: torch.fx.GraphModule, options: CompileOptions, casts_explicit: bool = False) -> None:
        # Whether autocast's casts are already in the graph (AOTAutograd traced it on the device),
        # so that compiling it must not apply the active autocast a second time.
        self.casts_explicit = casts_explicit
        # Tensors the graph reads as attributes (a compiled optimizer step's parameters and
        # state) are passed to its executables after the graph's inputs.
        self.gm, self.attributes = lift_tensor_attributes(gm)
        self.options = options
        self.name, self.function = _function_name()
        self.placeholders = [node.name for node in self.gm.graph.find_nodes(op="placeholder")]
        self.executables: dict[str, Callable[..., Any]] = {}
        # list inputs (compiled autograd's saved tensors) by their lengths: a flat graph each
        self.flattened: dict[tuple[int, ...], tuple[_NeuronGraph, Callable[..., list[Any]]]] = {}
        self.host_outputs = _host_output_positions(self.gm)
        self.symbolic_tensors = has_symbolic_tensors(self.gm)
        self.symints = frozenset(symint_positions(self.gm))
        # ints that only feed computations, with the bounds Dynamo guards: one executable takes
        # any value in them (cleared if the lowering had to specialise them after all)
        self.runtime_ints = runtime_int_positions(self.gm)
        self.runtime_floats = runtime_float_positions(self.gm)  # passed as 0-d host tensors
        # SymInt inputs the graph never reads. AOTAutograd passes a jagged nested tensor's ragged
        # size this way: a "nested int", which has no value to compile with or pass to a program.
        self.unread_symints = unread_symint_positions(self.gm)
        self._text: str | None = None
        self._by_signature: dict[tuple[Any, ...], Callable[..., Any]] = {}

    @property
    def dispatches_per_call(self) -> bool:
        """Whether each call must pick its executable (symbolic sizes, or ints that size tensors)."""
        return self.symbolic_tensors or bool(self.symints - self.runtime_ints.keys())

    def compiled(self, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        """What Dynamo (or AOTAutograd) calls: one executable, or this graph choosing per call."""
        if not self.dispatches_per_call:
            executable = self.executable_for([hint(value) for value in example_inputs])
            if not self.dispatches_per_call:  # the lowering kept the run-time ints symbolic
                return executable
        return self

    def _specs(self, inputs: Sequence[Any]) -> list[Any]:
        return [runtime_int_spec(self.runtime_ints[position]) if position in self.runtime_ints else _input_spec(value)
                for position, value in enumerate(inputs)]

    def _call_signature(self, inputs: Sequence[Any]) -> tuple[Any, ...]:
        """What selects an executable (the cache key's varying part), cheap to build and hash."""
        items: list[Any] = [torch.is_grad_enabled(), torch.is_autocast_enabled("neuron"),
                            torch.get_autocast_dtype("neuron")]
        for position, value in enumerate(inputs):
            if isinstance(value, torch.Tensor):
                items.append((value.shape, value.stride(), value.dtype, value.device.type, value.requires_grad))
            elif position in self.runtime_ints:
                items.append(RUNTIME_INT)
            elif isinstance(value, (bool, int, float, str, type(None))):
                items.append((type(value), value))  # the type too: True and 1 are equal keys
            else:
                items.append((type(value), repr(_input_spec(value))))
        return tuple(items)

    def _key(self, specs: list[Any]) -> str:
        if self._text is None:
            self._text = _graph_text(self.gm)
        return _cache_key(self._text, specs, self.options)

    def executable_for(self, inputs: Sequence[Any]) -> Callable[..., Any]:
        """The executable for ``inputs``' signature, called with the graph's inputs only."""
        nested = [position for position in self.unread_symints if _is_nested_int(inputs[position])]
        if nested:  # compiled, and called, with 0 in their place
            executable = self._executable_with_attributes(_with_zeros(inputs, nested))
            return lambda *args: executable(*_with_zeros(args, nested))
        return self._executable_with_attributes(inputs)

    def _executable_with_attributes(self, inputs: Sequence[Any]) -> Callable[..., Any]:
        if not self.attributes:
            executable = self._executable_for(inputs)
        else:
            attributes = self.attributes
            with_attributes = self._executable_for([*inputs, *attributes])
            executable = lambda *args: with_attributes(*args, *attributes)  # noqa: E731
        return _returning_host_outputs(executable, self.host_outputs) if self.host_outputs else executable

    def _executable_for(self, inputs: Sequence[Any]) -> Callable[..., Any]:
        if any(isinstance(value, (list, tuple)) for value in inputs):
            return self._flat_executable_for(inputs)
        # Graphs that pick an executable per call look it up without building a cache key.
        seen = self._call_signature(inputs)
        executable = self._by_signature.get(seen)
        if executable is not None:
            return executable
        specs = self._specs(inputs)
        key = self._key(specs)
        executable = self.executables.get(key)
        if executable is None:
            try:
                obtained = self._obtain(key, inputs, specs)
            except IntsSpecialised:  # the lowering guards on their values: one executable per value
                self.runtime_ints = {}
                return self._executable_for(inputs)
            executable = _on_core(obtained, _device_index(inputs))
            self.executables[key] = executable
            shapes = {name: tuple(spec[0]) for name, spec in zip(self.placeholders, specs)
                      if isinstance(spec, list) and not _is_module_state(name)}
            ints = {name: spec for name, spec in zip(self.placeholders, specs)
                    if _is_int_argument(name, spec)}
            _diagnostics.note_graph(self.function, shapes, self.options.graph_warning_threshold, ints)
        self._by_signature[seen] = executable
        return executable

    def _flat_executable_for(self, inputs: Sequence[Any]) -> Callable[..., Any]:
        lengths = tuple(len(value) if isinstance(value, (list, tuple)) else -1 for value in inputs)
        known = self.flattened.get(lengths)
        if known is None:
            flat_gm, flatten = flatten_sequence_inputs(self.gm, inputs)
            flat = _NeuronGraph(flat_gm, self.options, self.casts_explicit)
            flat.name, flat.function = self.name, self.function
            known = self.flattened[lengths] = (flat, flatten)
        flat, flatten = known
        executable = flat.executable_for(flatten(inputs))
        return lambda *args: executable(*flatten(args))

    def __call__(self, *args: Any) -> Any:  # symbolic graphs: one executable per signature
        return self.executable_for(args)(*args)

    def _obtain(self, key: str, inputs: Sequence[Any], specs: list[Any]) -> Callable[..., Any]:
        signature = _signature_text(self.placeholders, specs, self.runtime_floats)
        with _memory_lock:
            known = _loaded.get(key)
        if known is not None:
            metrics._record(metrics.GraphRecord(self.name, signature, "memory", 0.0, key, kernels=known.kernels))
            _count_inductor_kernels(known.inductor_kernels)
            _output_code.replay(known.output_code)
            return known.run
        from neuron_compile.cache import default_cache

        cache = default_cache() if self.options.cache else None
        start = time.perf_counter()
        counted_before = _inductor_kernel_count()
        if cache is not None:
            with cache.lock(key):  # another process compiling this graph finishes first
                loaded, output_code = self._load_cached(cache, key)
                source = "disk"
                if loaded is None:
                    with _output_code.recording() as output_code:
                        loaded, source = self._compile(inputs, cache, key, signature)
        else:
            with _output_code.recording() as output_code:
                loaded, source = self._compile(inputs, None, key, signature)
        seconds = time.perf_counter() - start
        reason = getattr(loaded, "_neuron_fallback_reason", "")
        kernels = getattr(loaded, "_neuron_kernels", 0)
        metrics._record(metrics.GraphRecord(self.name, signature, source, seconds, key, reason, kernels))
        with _memory_lock:
            _loaded[key] = _HeldExecutable(loaded, kernels, _inductor_kernel_count() - counted_before,
                                           tuple(output_code))
        return loaded

    def _load_cached(self, cache: Any, key: str) -> tuple[Callable[..., Any] | None, list[str]]:
        """The cached executable and the sources Inductor reported loading it; None if absent or bad."""
        payload = cache.get(key)
        if payload is None:
            return None, []
        try:
            executable = NeuronExecutable.from_bytes(payload)
            with _output_code.recording(light=executable.light) as output_code:
                return _loaded_executable(executable), output_code
        except Exception as error:  # noqa: BLE001 - a bad entry is a cache miss, never a failed step
            # A damaged entry, or one a different build of torch-neuronx wrote (its program
            # imports names this build no longer has): reported once, then replaced.
            warnings.warn(f"neuron compile cache entry {key} cannot be loaded "
                          f"({type(error).__name__}: {error}); recompiling", stacklevel=3)
            cache.remove(key)
            return None, []

    def _compile(self, inputs: Sequence[Any], cache: Any, key: str,
                 signature: str) -> tuple[Callable[..., Any], str]:
        """Compiles (and persists) the executable; returns it with its source for the metrics."""
        from neuron_compile._lowering import lower_graph

        start = time.perf_counter()
        try:
            # A graph with symbolic sizes compiles at its first call with each new shape, perhaps
            # under dispatch modes active at that call (AOTAutograd's first-call alias analysis,
            # around a jagged tensor's graph): the compiler's own tracing must not run under them.
            with _disable_current_modes():
                lowered = lower_graph(self.gm, inputs, self.runtime_ints, apply_autocast=not self.casts_explicit)
        except IntsSpecialised:
            raise
        except Exception as error:
            operator = _failing_operator(error)
            where = f" at operator {operator}" if operator else ""
            first_line = (str(error).strip().splitlines() or [""])[0]
            message = (f"the neuron compiler could not compile graph '{self.name}' ({signature}){where}: "
                       f"{type(error).__name__}: {first_line}")
            if not self.options.fallback_to_eager:
                raise NeuronCompileError(
                    message + ". Pass options={'fallback_to_eager': True} to torch.compile (or set "
                    "TORCH_NEURONX_FALLBACK_TO_EAGER=1) to run such graphs eagerly instead.") from error
            warnings.warn(message + "; running this graph eagerly (fallback_to_eager)", stacklevel=4)
            eager = self.gm.forward
            run = lambda *args: eager(*args)  # noqa: E731
            run._neuron_fallback_reason = f"{operator or type(error).__name__}"  # type: ignore[attr-defined]
            return run, "eager"
        if lowered.executable is None:
            run = lowered.run
            wrapped = lambda *args: run(*args)  # noqa: E731
            wrapped._neuron_fallback_reason = f"not persisted: {lowered.not_serialisable}"  # type: ignore[attr-defined]
            return wrapped, "compiled"
        if cache is not None:
            cache.put(key, lowered.executable.to_bytes(), {
                "graph": self.name, "inputs": signature, "torch": torch.__version__,
                "compile_seconds": round(time.perf_counter() - start, 3),
            })
        return _with_kernel_count(lowered.run, len(lowered.executable.kernels)), "compiled"


def _has_subclass_input(example_inputs: Sequence[Any]) -> bool:
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    return any(is_traceable_wrapper_subclass(value) for value in example_inputs)


def _compile_through_aot_autograd(gm: torch.fx.GraphModule, example_inputs: list[Any],
                                  options: CompileOptions) -> Callable[..., Any]:
    """Graphs with tensor-subclass inputs (DTensor from tensor parallelism and FSDP2).

    AOTAutograd desugars each subclass into its plain inner tensors (a DTensor into its local
    shard; its redistributions are already functional collectives in the graph), partitions
    forward and backward, and rewraps the outputs at run time. Each plain forward or backward
    graph is then compiled like any other graph (own executable per signature, persistent cache,
    metrics); its collectives run through the process group of the tensors' device.
    """
    from functorch.compile import make_boxed_func, min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd

    def compile_plain(plain_gm: torch.fx.GraphModule, plain_inputs: list[Any]) -> Callable[..., Any]:
        graph = _NeuronGraph(plain_gm, options, casts_explicit=True)
        backward = any(name.startswith("tangents") for name in graph.placeholders)
        graph.name += " backward" if backward else " forward"
        return make_boxed_func(graph.compiled(plain_inputs))

    backend = aot_autograd(fw_compiler=compile_plain, partition_fn=min_cut_rematerialization_partition,
                           keep_inference_input_mutations=True)
    return backend(gm, example_inputs)


def neuron_backend(gm: torch.fx.GraphModule, example_inputs: list[Any], *,
                   mode: str | None = None, options: dict[str, Any] | None = None) -> Callable[..., Any]:
    """Dynamo backend: compiles ``gm`` into neuron executables, one per input signature."""
    global _warned_dynamic
    compile_options = CompileOptions.resolve(mode, options)
    if _has_subclass_input(example_inputs):
        return _compile_through_aot_autograd(gm, example_inputs, compile_options)
    graph = _NeuronGraph(gm, compile_options)
    if graph.symbolic_tensors and not torch._dynamo.config.assume_static_by_default and not _warned_dynamic:
        _warned_dynamic = True
        warnings.warn(
            "torch.compile(backend='neuron', dynamic=True): Trainium graphs have static shapes, so "
            "the neuron backend compiles one graph per input shape it is called with. Pad inputs "
            "to buckets (neuron_compile.BucketPolicy) to bound the number of graphs.", stacklevel=2)
    if graph.symbolic_tensors:
        return graph
    return graph.compiled(example_inputs)
