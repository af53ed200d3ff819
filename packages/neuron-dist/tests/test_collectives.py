"""Every collective of the "neuron" backend on 2 and 4 ranks (see workers/collectives.py)."""

from __future__ import annotations

import pytest

from conftest import assert_case, launch, results

CASES = [
    "binds_local_core",
    *(f"all_reduce_{d}" for d in ("float32", "bfloat16", "float16", "int64", "int32", "uint8", "int16")),
    "broadcast_and_reduce",
    "all_gather_list_and_into_tensor",
    "reduce_scatter_list_and_tensor",
    "all_to_all_single_equal_and_uneven",
    "all_to_all_list",
    "gather_and_scatter",
    "send_recv_ring_and_batch_p2p",
    "async_handles_and_futures",
    "work_queries_and_any_source_recv",
    "coalesced_calls",
    "object_collectives",
    "functional_collectives",
    "subgroups_from_new_group",
    "device_mesh_submeshes",
    "mismatched_shapes_raise_on_every_rank",
    "mismatched_dtypes_raise_on_every_rank",
    "same_sizes_in_different_shapes_reduce_as_with_gloo",
    "complex_and_unsupported_reduce_ops_are_refused_on_every_rank",
    "mismatched_collectives_raise",
    "mismatch_between_inline_and_large_raises",
    "inline_and_gloo_paths_agree_with_gloo",
    "speculated_collectives_agree_with_gloo_and_mismatches_still_raise",
    "speculated_async_collectives_agree_with_gloo",
    "a_repeating_mix_of_sizes_travels_inside_the_exchange",
    "collectives_under_inference_mode_then_outside",
    "wrong_device_names_backend_and_device",
    "non_contiguous_tensors_raise_instead_of_corrupting",
    "strided_tensors_work_where_gloo_copies_them",
    "group_sequence_numbers_count_collectives",
    "tensors_that_require_grad_are_valid_arguments",
    "sparse_cpu_all_reduce_sums_like_gloo",
    "ddp_zero_overlap_hook_works_and_interleaved_is_refused",
    "invalid_arguments_raise_at_call_and_leave_the_group_usable",
    "list_all_reduce_reduces_every_tensor_of_every_rank",
    "list_collectives_follow_gloos_semantics",
    "timeouts_can_be_changed_after_init",
    "collectives_work_with_neuron_as_the_default_device",
    "collectives_pass_through_c10d_dispatcher_ops",
    "async_collectives_return_before_other_ranks_issue_them",
    "waited_collectives_leave_nothing_for_the_progress_thread",
    "blocking_collectives_run_on_the_calling_thread",
    "cpu_tensors_also_work",
    "hsdp_on_2x2_mesh_matches_single_device",
    "fsdp_tp_meta_init_matches_single_device",
]


@pytest.fixture(scope="module", params=[2, 4], ids=["2ranks", "4ranks"])
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, list[dict]]:
    world = request.param
    outdir = tmp_path_factory.mktemp(f"collectives{world}")
    proc = launch("collectives.py", outdir, world)
    return world, results(outdir, world, proc)


@pytest.mark.parametrize("case", CASES)
def test_collective(run: tuple[int, list[dict]], case: str) -> None:
    world, per_rank = run
    values = assert_case(per_rank, case)
    if case == "binds_local_core":
        assert values == list(range(world))
    if case in ("hsdp_on_2x2_mesh_matches_single_device", "fsdp_tp_meta_init_matches_single_device"):
        assert (values[0] is None) == (world != 4), values
    if case == "strided_tensors_work_where_gloo_copies_them":  # rank 0 also checks what it gathered
        assert values[0] == 2 * (7 * world + 4) and all(v == 2 * (6 * world + 4) for v in values[1:]), values


def test_async_collectives_under_distributed_debug_detail(tmp_path) -> None:
    """torch's DETAIL wrapper compares each call's sequence number across ranks at issue."""
    proc = launch("debug_detail.py", tmp_path, 2, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    per_rank = results(tmp_path, 2, proc)
    values = assert_case(per_rank, "back_to_back_async_collectives_keep_ranks_in_step")
    assert values[0] == values[1] >= 150, values
    assert_case(per_rank, "ddp_bf16_compress_hook_is_accepted")
    assert assert_case(per_rank, "monitored_barrier_is_accepted") == [True, True]
