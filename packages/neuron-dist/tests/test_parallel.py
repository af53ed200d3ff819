"""DDP, FSDP2, tensor/sequence parallelism and DTensor on 2 neuron ranks vs. a single device."""

from __future__ import annotations

import pytest

from conftest import assert_case, launch, results

CASES = [
    "ddp_matches_single_device",
    "ddp_device_ids_moves_cpu_inputs",
    "ddp_bf16_compress_hook",
    "ddp_builtin_cpp_comm_hooks_match_single_device",
    "ddp_power_sgd_hook_matches_gloo",
    "ddp_compiled_runs_the_backend_outside_dynamo",
    "ddp_records_runtime_stats",
    "sync_batch_norm_matches_single_device_batch_norm",
    "fsdp2_fp32_matches_single_device",
    "fsdp2_bf16_mixed_precision_matches_single_device",
    "fsdp2_collectives_visible_to_comm_debug_mode",
    "tensor_parallel_colwise_rowwise",
    "sequence_parallel_plan",
    "dtensor_distribute_redistribute_ops",
    "dtensor_random_ops_match_the_unsharded_op",
    "fsdp2_meta_device_init_matches_single_device_init",
    "dtensor_random_ops_compile",
    "dtensor_compiled_with_functional_collectives",
]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    outdir = tmp_path_factory.mktemp("parallel")
    proc = launch("parallel.py", outdir, 2)
    return results(outdir, 2, proc)


@pytest.mark.parametrize("case", CASES)
def test_parallel(run: list[dict], case: str) -> None:
    values = assert_case(run, case)
    assert len(set(map(str, values))) == 1, f"ranks disagree: {values}"
