"""TRL's SFTTrainer under torchrun with transformers' DistributedConfig, against a single-device run.

Three runs, each launched with torchrun (one process per emulated NeuronCore), the model loaded by
TRL through ``SFTConfig(model_init_kwargs={"distributed_config": DistributedConfig(...)})``:

===========================  =========  ================  =============================
DistributedConfig            processes  per-device batch  data-parallel (dp) size
===========================  =========  ================  =============================
``tp_size=2``                2          4                 1 (both ranks: the same batch)
``fsdp_size=2``              2          2                 2
``tp_size=2, fsdp_size=2``   4          2                 2 (each TP pair shares a batch)
===========================  =========  ================  =============================

What "the same run" means. Every run, and the single-device reference (one core, no
DistributedConfig, per-device batch 4), takes the same *global* batch of 4 examples per
optimizer step (per-device batch x dp size), in the same order (sequential sampling): accelerate
gives data-parallel rank ``r`` the per-device batches ``r, r + dp, ...`` of the sequence, so the
union of the dp ranks' batches at step ``k`` is exactly the reference's batch ``k`` (checked on
the collated tensors below). With ``average_tokens_across_devices`` (the default) each rank
normalises its summed token loss by the token count of the whole global batch (TP ranks, which
see the same batch, are not double counted), FSDP averages gradients over the dp ranks, and the
Trainer logs the mean over ranks: the gradients, the updates and the logged loss are those of
the global batch on one device. Only the floating-point summation order differs (sharded matmuls,
reduce-scatter), so losses and gradient norms must agree within fp32 tolerance (rtol 1e-4). fp32
throughout (``bf16=False``), no dropout, fixed seeds, a constant learning rate large enough that
a wrong gradient shows within the 4 steps.

Also checked on every rank: the trainer saw the model was distributed by transformers and did not
wrap it again (no DDP, no accelerate FSDP; the parameters are DTensors on the model's own mesh),
each rank runs on core ``LOCAL_RANK``, and the batches TRL collates on neuron are padded to a
multiple of 128 (recorded by wrapping the data collator, and on the tensors the model receives).
``save_strategy="no"`` with ``save_only_model=True``: upstream refuses resumable checkpoints for
models sharded at load time.

Each torchrun launch has a timeout and is killed with its whole process group on expiry.
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import _sft_fixtures as fixtures  # noqa: E402
from _torchrun import rank_results, torchrun  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")

WORKER = Path(fixtures.__file__)
LAUNCH_TIMEOUT = 240.0  # seconds per torchrun launch (a 4-process run takes ~80 s on 2 busy cores)
RTOL = 1e-4

# name -> (processes, per-device batch, DistributedConfig kwargs, mesh dimensions of the DTensor parameters)
CASES: dict[str, tuple[int, int, dict[str, int], list[list[str]]]] = {
    "tp2": (2, 4, {"tp_size": 2}, [["tp"]]),
    "fsdp2": (2, 2, {"fsdp_size": 2}, [["fsdp"]]),
    # TP-sharded weights on the 2-D ("fsdp", "tp") mesh, the others (norms) sharded over "fsdp" only.
    "tp2_fsdp2": (4, 2, {"tp_size": 2, "fsdp_size": 2}, [["fsdp"], ["fsdp", "tp"]]),
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> str:
    return fixtures.save_checkpoint(tmp_path_factory.mktemp("sft_dist_llama"))


@pytest.fixture(scope="module")
def reference(checkpoint: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The single-device run: one core, no DistributedConfig, the global batch on one device."""
    result = fixtures.run_sft(checkpoint, str(tmp_path_factory.mktemp("sft_ref")), fixtures.GLOBAL_BATCH)
    assert result["device"] == "neuron:0" and result["pad_to_multiple_of"] == 128
    assert result["wrapping"]["dtensor_params"] == 0 and not result["wrapping"]["distributed_by_transformers"]
    assert len(result["losses"]) == fixtures.STEPS
    return result


def _sequences(batch: dict[str, Any]) -> collections.Counter:
    return collections.Counter(tuple(row) for row in batch["real_tokens"])


def _check_data(results: list[dict[str, Any]], reference: dict[str, Any], tp_size: int) -> None:
    """Ranks of one TP group share each batch; the dp ranks' batches together are the reference's."""
    dp_size = len(results) // tp_size
    for step, ref_batch in enumerate(reference["collated"]):
        union: collections.Counter = collections.Counter()
        for dp_rank in range(dp_size):
            group = results[dp_rank * tp_size:(dp_rank + 1) * tp_size]  # mesh ("fsdp", "tp"): tp is innermost
            batches = [r["collated"][step] for r in group]
            assert all(b == batches[0] for b in batches), f"step {step}: TP ranks got different batches"
            union += _sequences(batches[0])
        assert union == _sequences(ref_batch), f"step {step}: the dp ranks' batches are not the reference batch"


def _check_padding(rank: int, result: dict[str, Any], per_device_batch: int) -> None:
    assert result["pad_to_multiple_of"] == 128
    assert len(result["collated"]) == len(result["fed"]) == fixtures.STEPS
    for collated, fed in zip(result["collated"], result["fed"]):
        batch, length = collated["shape"]
        assert batch == per_device_batch and length % 128 == 0, collated["shape"]
        assert any(len(row) < length for row in collated["real_tokens"])  # padding really was added
        assert fed == {"shape": collated["shape"], "device": f"neuron:{rank}"}


def _check_not_wrapped_again(rank: int, facts: dict[str, Any], mesh_dims: list[list[str]]) -> None:
    assert facts["distributed_by_transformers"], facts
    assert facts["model_wrapped_is_model"] and facts["ddp_modules"] == 0, facts
    assert not facts["accelerate_fsdp"], facts
    assert facts["dtensor_params"] > 0 and facts["param_devices"] == [f"neuron:{rank}"], facts
    assert facts["param_mesh_dims"] == mesh_dims, facts  # the model's own mesh, not one accelerate built
    assert facts["distributed_type"] == "MULTI_NEURON", facts


@pytest.mark.parametrize("case", list(CASES))
def test_sft_distributed_matches_single_device(case: str, checkpoint: str, reference: dict[str, Any],
                                               tmp_path: Path) -> None:
    nproc, per_device_batch, config, mesh_dims = CASES[case]
    if torch.neuron.device_count() < nproc:
        pytest.skip(f"needs {nproc} NeuronCores, the emulated instance has {torch.neuron.device_count()}")
    tp_size = config.get("tp_size", 1)
    assert per_device_batch * nproc // tp_size == fixtures.GLOBAL_BATCH  # same effective batch as the reference
    spec = {"checkpoint": checkpoint, "per_device_batch": per_device_batch, "distributed": config}
    results = rank_results(tmp_path, nproc, torchrun(WORKER, [str(tmp_path), json.dumps(spec)], nproc, LAUNCH_TIMEOUT))

    _check_data(results, reference, tp_size)
    for rank, result in enumerate(results):
        _check_padding(rank, result, per_device_batch)
        _check_not_wrapped_again(rank, result["wrapping"], mesh_dims)
        torch.testing.assert_close(result["losses"], reference["losses"], rtol=RTOL, atol=0.0)
        torch.testing.assert_close(result["grad_norms"], reference["grad_norms"], rtol=RTOL, atol=0.0)
