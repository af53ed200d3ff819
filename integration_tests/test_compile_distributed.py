"""DTensor programs compiled with the neuron backend on 2 ranks (tensor parallel, FSDP2, redistribute).

AOTAutograd desugars DTensor graph inputs into their local shards, so the compiled forward and
backward graphs are plain neuron graphs whose collectives are functional collectives running
on the "neuron" process group. Each rank compares with the same computation run eagerly on one
device (``_compiled_dtensor_worker.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _torchrun import rank_results, torchrun

WORKER = Path(__file__).with_name("_compiled_dtensor_worker.py")
TIMEOUT = 600.0
TOLERANCE = 1e-5  # relative to the largest magnitude of the single-device value (fp32)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out_dir = tmp_path_factory.mktemp("compiled_dtensor")
    proc = torchrun(WORKER, [str(out_dir)], 2, TIMEOUT, env={"TORCH_NEURONX_NEFF_CACHE_DIR": str(out_dir / "neff")})
    return rank_results(out_dir, 2, proc)


def test_tensor_parallel_training_compiles_and_matches_one_device(ranks):
    for result in ranks:
        tp = result["tp_training"]
        assert tp["dtensor_params"] == 4  # up and down, weight and bias
        assert max(tp["output_errors"]) < TOLERANCE and max(tp["grad_errors"]) < TOLERANCE, tp
        for loss, ref_loss in tp["losses"]:
            assert loss == pytest.approx(ref_loss, rel=1e-5)
    assert ranks[0]["tp_training"]["losses"] == ranks[1]["tp_training"]["losses"]


def test_tensor_parallel_training_under_bf16_autocast_matches_one_device(ranks):
    for result in ranks:
        tp = result["tp_training_bf16_autocast"]
        assert max(tp["output_errors"]) < 2e-2 and max(tp["grad_errors"]) < 2e-2, tp
        for loss, ref_loss in tp["losses"]:
            assert loss == pytest.approx(ref_loss, rel=2e-2)


def test_fsdp2_training_compiles_and_matches_one_device(ranks):
    for result in ranks:
        fsdp = result["fsdp2_training"]
        assert max(fsdp["grad_errors"]) < TOLERANCE, fsdp
        for loss, ref_loss in fsdp["losses"]:
            assert loss == pytest.approx(ref_loss, rel=1e-5)


def test_redistribute_compiles_to_a_collective(ranks):
    for result in ranks:
        assert result["redistribute"] == {"error": 0.0, "shape": [8, 4]}


def test_every_graph_was_compiled_none_ran_eagerly(ranks):
    for result in ranks:
        counters = result["counters"]
        assert counters["eager_fallbacks"] == 0
        # TP forward and backward (DTensor inputs), the FSDP2 block, the redistribute program
        assert counters["graphs"] >= 4 and counters["compilations"] + counters["persistent_hits"] >= 4, counters
