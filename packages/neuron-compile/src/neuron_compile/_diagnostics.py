"""Warns, once per function, when shapes keep changing and each new shape is a new graph.

Trainium runs one compiled graph per input shape, so a function called with many different
sequence lengths compiles many graphs. Past a threshold a single warning names the input
dimension that keeps changing and the bucket policy that would bound the count, or the int
argument whose values size a tensor (each value is a graph too).
"""

from __future__ import annotations

import collections
import re
import threading
import warnings
from collections.abc import Sequence

__all__ = ["ShapeChurnWarning", "note_graph"]


class ShapeChurnWarning(UserWarning):
    """One function compiled more graphs than the threshold because input shapes vary."""


_lock = threading.Lock()
_seen: dict[str, list[dict[str, tuple[int, ...]]]] = collections.defaultdict(list)
_seen_ints: dict[str, list[dict[str, int]]] = collections.defaultdict(list)
_warned: set[str] = set()


def readable_input_name(placeholder: str) -> str:
    """``l_kwargs_input_ids_`` -> ``input_ids``: Dynamo's placeholder names, as the user wrote them."""
    name = re.sub(r"^[lL]_", "", placeholder).rstrip("_")
    name = re.sub(r"^(kwargs|args)_", "", name)
    return name.replace("_modules_", ".").replace("_parameters_", ".")


def _varying_dimension(signatures: Sequence[dict[str, tuple[int, ...]]]) -> tuple[str, int, list[int]] | None:
    best: tuple[str, int, list[int]] | None = None
    for name in signatures[-1]:
        shapes = [sig[name] for sig in signatures if name in sig]
        for dim in range(len(shapes[-1])):
            sizes = sorted({shape[dim] for shape in shapes if len(shape) > dim})
            if len(sizes) > 1 and (best is None or len(sizes) > len(best[2])):
                best = (name, dim, sizes)
    return best


def _varying_int(values: Sequence[dict[str, int]]) -> tuple[str, list[int]] | None:
    best: tuple[str, list[int]] | None = None
    for name in values[-1] if values else ():
        seen = sorted({ints[name] for ints in values if name in ints})
        if len(seen) > 1 and (best is None or len(seen) > len(best[1])):
            best = (name, seen)
    return best


def note_graph(function: str, shapes: dict[str, tuple[int, ...]], threshold: int,
               ints: dict[str, int] | None = None) -> None:
    """Records that ``function`` got a graph for ``shapes`` (and int arguments ``ints``); warns
    once past ``threshold``."""
    with _lock:
        _seen[function].append(shapes)
        _seen_ints[function].append(dict(ints or {}))
        signatures = list(_seen[function])
        int_values = list(_seen_ints[function])
        if len(signatures) <= threshold or function in _warned:
            return
        _warned.add(function)
    varying = _varying_dimension(signatures)
    varying_int = _varying_int(int_values) if varying is None else None
    if varying_int is not None:
        name, values = varying_int
        shown = ", ".join(map(str, values[:8])) + (", ..." if len(values) > 8 else "")
        detail = (f"int argument '{readable_input_name(name)}' took {len(values)} different values "
                  f"({shown}) and sizes a tensor, so each value is a graph")
        advice = "round it up to a few values (a bucket), or compute the size from a padded tensor's shape"
    elif varying is None:
        detail = "its inputs' shapes did not change, so guards on other values caused the recompiles"
        advice = "see torch_neuronx.metrics.report() for the failing guards"
    else:
        name, dim, sizes = varying
        shown = ", ".join(map(str, sizes[:8])) + (", ..." if len(sizes) > 8 else "")
        detail = (f"input '{readable_input_name(name)}' dimension {dim} took {len(sizes)} different "
                  f"sizes ({shown})")
        advice = ("pad that dimension to a bucket to bound the number of graphs, e.g. "
                  "neuron_compile.MultipleOfBuckets(128, max_length=2048) with "
                  "neuron_compile.pad_batch, BucketCollator or BucketedCausalLM (at most 16 graphs)")
    display = function.split(":", 1)[0]
    warnings.warn(
        f"torch.compile(backend='neuron'): '{display}' has compiled {len(signatures)} graphs, one per "
        f"input shape (threshold {threshold}); {detail}. To avoid compiling a graph per length, "
        f"{advice}.", ShapeChurnWarning, stacklevel=2)


def _reset() -> None:
    with _lock:
        _seen.clear()
        _seen_ints.clear()
        _warned.clear()
