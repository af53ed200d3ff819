"""Distributed checkpoints: saved by 2 ranks, loaded by 1 and by 4 ranks (resharded)."""

from __future__ import annotations

import pytest

from conftest import assert_case, launch, results


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory):
    outdir = tmp_path_factory.mktemp("save")
    ckpt = tmp_path_factory.mktemp("ckpt")
    proc = launch("checkpoint.py", outdir, 2, "save", str(ckpt))
    assert_case(results(outdir, 2, proc), "save_sharded")
    return ckpt


@pytest.mark.parametrize("world", [1, 4])
def test_load_resharded(checkpoint, tmp_path, world: int) -> None:
    proc = launch("checkpoint.py", tmp_path, world, "load", str(checkpoint))
    assert assert_case(results(tmp_path, world, proc), "load_resharded") == [world] * world
