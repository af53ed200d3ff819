"""Runs a worker's named cases in every rank and records each outcome for the test process.

A case that raises is recorded with its traceback; the others keep running, so one launch of a
multi-process worker covers many tests. Results go to ``<outdir>/rank<global rank>.json``.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist

__all__ = ["Cases", "destroy_when_every_rank_is_done"]


class Cases:
    """Registry of a worker's cases: ``@cases.case`` to add one, ``cases.run()`` to run them all."""

    def __init__(self) -> None:
        self._cases: list[tuple[str, Callable[[], object]]] = []

    def case(self, fn: Callable[[], object]) -> Callable[[], object]:
        self._cases.append((fn.__name__, fn))
        return fn

    def run(self, outdir: str | None = None, only: list[str] | None = None) -> None:
        outdir = outdir or sys.argv[1]
        results: dict[str, dict[str, object]] = {}
        for name, fn in self._cases:
            if only and name not in only:
                continue
            try:
                value = fn()
                results[name] = {"ok": True, "value": value}
            except BaseException as error:  # noqa: BLE001 (recorded for the test to report)
                results[name] = {"ok": False, "error": "".join(traceback.format_exception(error))}
        rank = os.environ.get("RANK", "0")
        path = Path(outdir) / f"rank{rank}.json"
        path.write_text(json.dumps(results, default=str))


def destroy_when_every_rank_is_done(group: dist.ProcessGroup) -> None:
    """Destroys a helper group once no rank uses it any more: a rank that closed its gloo
    sockets while a slower peer was still finishing on them, or connecting the next case's group,
    made that peer fail with gloo's "Connection closed by peer" (seen once in CI on 4 ranks)."""
    dist.barrier()
    dist.destroy_process_group(group)
