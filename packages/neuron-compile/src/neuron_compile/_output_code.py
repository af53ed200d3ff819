"""The generated code of executables served from this process's memory, for Inductor's code hook.

Inductor hands each program's source to ``GraphLowering.save_output_code`` when it generates
one or loads one from a cache; ``torch._inductor.utils.run_and_get_code`` (which PyTorch's own
tests and users' tooling read generated code with) sets that hook and calls
``torch._dynamo.reset()`` first. An executable this process already holds survives the reset
and is served without Inductor, so the hook heard nothing and the tool found no code. The
sources recorded while an executable was compiled or loaded are replayed on such hits instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

__all__: list[str] = []


def _graph_lowering():
    from torch._inductor.graph import GraphLowering

    return GraphLowering


@contextlib.contextmanager
def recording() -> Iterator[list[str]]:
    """Collects the sources Inductor reports within the context, passing them on to any hook."""
    lowering = _graph_lowering()
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
    hook = _graph_lowering().save_output_code if sources else None
    if hook is not None:
        for code in sources:
            hook(code)
