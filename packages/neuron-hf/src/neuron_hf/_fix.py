"""The record every fix is described by, its version guard, and rebinding helpers.

A *fix* corrects one upstream behaviour of one library on the neuron device. It names the
module whose import triggers it, the distribution and versions it was verified against (it
is skipped, with a log line, on any other version), and the upstream behaviour it corrects.
Replacement functions check :func:`neuron_hf._device.on_neuron` on every call and otherwise
defer to the original, so nothing changes for CPU or CUDA users.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

__all__ = ["Fix", "replace_function", "original_of"]

logger = logging.getLogger("neuron_hf")

_ORIGINAL = "__neuron_hf_original__"


@dataclass(frozen=True)
class Fix:
    """One correction to one library, applied when ``module`` is imported."""

    name: str
    module: str
    distribution: str
    versions: str
    corrects: str
    apply: Callable[[ModuleType], None]

    def version_matches(self) -> bool:
        """Whether the installed distribution is one this fix was verified against."""
        from packaging.specifiers import SpecifierSet  # lazy: keeps `import torch` cheap
        from packaging.version import Version

        try:
            installed = importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return False
        return Version(installed) in SpecifierSet(self.versions)


def original_of(func: Any) -> Any:
    """The upstream object a replacement wraps (``func`` itself if it is not one of ours)."""
    return getattr(func, _ORIGINAL, func)


def replace_function(
    owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]], rebind: tuple[str, ...] = ()
) -> None:
    """Replaces ``owner.name`` (a module or class attribute) by ``make(original)``.

    Every already imported module under one of the ``rebind`` package prefixes that holds the
    original object (``from x import name``) gets the replacement too; modules imported
    afterwards bind the replacement themselves.
    """
    original = getattr(owner, name)
    if hasattr(original, _ORIGINAL):
        return
    replacement = functools.wraps(original)(make(original))
    setattr(replacement, _ORIGINAL, original)
    for mod_name, mod in list(sys.modules.items()):
        if mod is None or not any(mod_name == p or mod_name.startswith(p + ".") for p in rebind):
            continue
        namespace = getattr(mod, "__dict__", {})
        for attr, value in list(namespace.items()):
            if value is original:
                setattr(mod, attr, replacement)
    setattr(owner, name, replacement)
