"""neuron_hf: the glue transformers, accelerate, TRL and PEFT still need on the neuron device.

Vocabulary: a *fix* corrects one upstream behaviour on neuron (see :class:`Fix`); it is
*armed* when :func:`install` runs (``import torch`` does it through our ``torch.backends``
entry point) and *applied* when its module is imported, if the installed library version is
one the fix was verified against. Applied fixes act only when the current accelerator is
neuron and defer to the library otherwise.
"""

from __future__ import annotations

import logging
import sys

from neuron_hf._fix import Fix, original_of

__all__ = ["Fix", "applied_fixes", "install", "original_of", "skipped_fixes", "__version__"]
__version__ = "0.1.0"

logger = logging.getLogger("neuron_hf")

_installed = False
_applied: list[str] = []
_skipped: dict[str, str] = {}


def _apply(fix: Fix) -> None:
    from neuron_runtime._post_import import register_post_import_hook

    def hook(module: object) -> None:
        if not fix.version_matches():
            _skipped[fix.name] = f"{fix.distribution} is not {fix.versions}"
            logger.info("neuron_hf: %s not applied (%s)", fix.name, _skipped[fix.name])
            return
        fix.apply(module)  # type: ignore[arg-type]
        _applied.append(fix.name)

    register_post_import_hook(fix.module, hook)


def install() -> None:
    """Arms every fix: each applies when its module is imported (now, if it already is)."""
    global _installed
    if _installed:
        return
    # Imported here, not at the top: importing neuron_runtime imports torch, whose autoload
    # calls install(), and ``import neuron_hf.x`` before ``import torch`` must not be circular.
    from neuron_runtime._post_import import install_finder, register_post_import_hook

    install_finder()
    fixes = sys.modules.get("neuron_hf.fixes")
    if fixes is not None and getattr(fixes.__spec__, "_initializing", False):
        # torch's autoload ran while a fix module imported torch: arm once the fixes exist
        register_post_import_hook("neuron_hf.fixes", lambda _module: install())
        return
    _installed = True
    from neuron_hf.fixes import ALL_FIXES

    for fix in ALL_FIXES:
        _apply(fix)


def applied_fixes() -> list[str]:
    """Names of the fixes applied so far in this process."""
    return list(_applied)


def skipped_fixes() -> dict[str, str]:
    """Fixes whose module was imported but whose library version they were not verified on."""
    return dict(_skipped)
