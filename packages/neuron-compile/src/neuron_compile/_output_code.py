"""The generated code of executables, for Inductor's code hook; and loading without Inductor's lowering.

Inductor hands each program's source to ``GraphLowering.save_output_code`` when it generates
one or loads one from a cache; ``torch._inductor.utils.run_and_get_code`` (which PyTorch's own
tests and users' tooling read generated code with) sets that hook and calls
``torch._dynamo.reset()`` first. An executable this process already holds survives the reset
and is served without Inductor, so the hook heard nothing and the tool found no code. The
sources recorded while an executable was compiled or loaded are replayed on such hits instead.

Loading a program from the persistent cache goes through Inductor's cache-hit path, which
imports ``torch._inductor.graph`` only to call that hook; importing it imports every lowering
module (~2 s of a warm process's start, which running a program never needs). Programs our
code generator marks as *light* (:data:`LIGHT_PROGRAM_MARKER`: they import no lowering module
themselves) are therefore loaded with a stand-in ``torch._inductor.graph`` holding only the
hook, for the duration of the load, when the real module is not imported yet (then nobody can
have set a hook on it). Likewise ``torch._inductor.debug``, which a running program reads two
flags of on every call, is a stand-in attribute until something imports the real module.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import sys
import types
from collections.abc import Iterator, Sequence
from typing import Any

__all__: list[str] = []

LIGHT_PROGRAM_MARKER = "# neuron_compile: this program imports no Inductor lowering module"
_GRAPH_MODULE = "torch._inductor.graph"
_DEBUG_MODULE = "torch._inductor.debug"


def _graph_lowering() -> Any:
    from torch._inductor.graph import GraphLowering

    return GraphLowering


# Inductor modules that bind ``GraphLowering`` when imported (tests check this list against
# torch's sources): importing one during a load must find the real module, so the stand-in
# steps aside first.
_BINDS_GRAPH_LOWERING = frozenset({
    "torch._inductor.compile_fx", "torch._inductor.compile_fx_ext", "torch._inductor.subgraph_lowering",
    "torch._inductor.lowering", "torch._inductor.select_algorithm",
})


class _StandInRemover(importlib.abc.MetaPathFinder):
    """Removes the stand-in from ``sys.modules`` before a module that binds ``GraphLowering`` loads."""

    def __init__(self, stand_in: types.ModuleType) -> None:
        self._stand_in = stand_in

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name in _BINDS_GRAPH_LOWERING and sys.modules.get(_GRAPH_MODULE) is self._stand_in:
            del sys.modules[_GRAPH_MODULE]
        return None  # the usual finders import it


@contextlib.contextmanager
def _stand_in_graph_module() -> Iterator[Any]:
    """Yields the ``GraphLowering`` a load should report to: a stand-in's if Inductor's lowering
    is not imported (the stand-in leaves ``sys.modules`` on exit), else the real class.

    The stand-in is used only while this thread holds Dynamo's compile lock (reentrant: the
    backend runs under it), so no compilation in another thread sees it; if another thread
    holds the lock, the real module is imported instead of waiting (a load may hold a cache
    entry's file lock that the other thread's compilation waits for).
    """
    from torch._dynamo.convert_frame import compile_lock

    if _GRAPH_MODULE in sys.modules or not compile_lock.acquire(blocking=False):
        yield _graph_lowering()
        return
    try:
        if _GRAPH_MODULE in sys.modules:
            yield sys.modules[_GRAPH_MODULE].GraphLowering
            return
        stand_in = types.ModuleType(_GRAPH_MODULE, "neuron_compile's stand-in while loading a program")
        stand_in.GraphLowering = type("GraphLowering", (), {"save_output_code": None})  # type: ignore[attr-defined]
        remover = _StandInRemover(stand_in)
        sys.modules[_GRAPH_MODULE] = stand_in
        sys.meta_path.insert(0, remover)
        try:
            yield stand_in.GraphLowering  # type: ignore[attr-defined]
        finally:
            sys.meta_path.remove(remover)
            if sys.modules.get(_GRAPH_MODULE) is stand_in:
                del sys.modules[_GRAPH_MODULE]
    finally:
        compile_lock.release()


@contextlib.contextmanager
def recording(light: bool = False) -> Iterator[list[str]]:
    """Collects the sources Inductor reports within the context, passing them on to any hook.

    ``light``: the context only loads programs marked with :data:`LIGHT_PROGRAM_MARKER`, so it
    may use the stand-in module (never for compiling: the lowering needs the real one).
    """
    with _stand_in_graph_module() if light else contextlib.nullcontext(_graph_lowering()) as lowering:
        previous = lowering.save_output_code
        recorded: list[str] = []

        def save(code: str) -> None:
            recorded.append(code)
            if previous is not None:
                previous(code)

        lowering.save_output_code = save
        try:
            yield recorded
        finally:
            lowering.save_output_code = previous


def replay(sources: Sequence[str]) -> None:
    """Reports ``sources`` to Inductor's hook, as Inductor's own cache hits do, if one is set."""
    graph_module = sys.modules.get(_GRAPH_MODULE)
    hook = graph_module.GraphLowering.save_output_code if sources and graph_module is not None else None
    if hook is not None:
        for code in sources:
            hook(code)


class _DeferredInductorDebug(types.ModuleType):
    """``torch._inductor.debug`` until something imports it: the two flags Inductor's programs read
    on every call, at their defaults (only the real module's own context managers change them).

    Any other use imports the real module (~350 modules: its IR and scheduler), which then
    replaces this object as the package's attribute, as every import of a submodule does.
    """

    _DEFAULTS = {"RECORD_GRAPH_EXECUTION": False, "GRAPH_EXECUTION_ORDER": None}

    def __getattr__(self, name: str) -> Any:
        real = sys.modules.get(_DEBUG_MODULE)
        if real is None and name in self._DEFAULTS:
            return self._DEFAULTS[name]
        return getattr(real if real is not None else importlib.import_module(_DEBUG_MODULE), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(importlib.import_module(_DEBUG_MODULE), name, value)


def defer_inductor_debug() -> None:
    """Lets loaded programs run without importing ``torch._inductor.debug`` (see the class above)."""
    import torch._inductor as inductor

    if _DEBUG_MODULE not in sys.modules and not hasattr(inductor, "debug"):
        inductor.debug = _DeferredInductorDebug(_DEBUG_MODULE)  # type: ignore[attr-defined]
