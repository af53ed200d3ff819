"""Ways of starting the group: no backend and a device map (2 ranks); a core-bound group (4 ranks)
with CPU subgroups, split groups and a 2-D DeviceMesh."""

from __future__ import annotations

import pytest
from conftest import assert_case, launch, results


@pytest.fixture(scope="module")
def core_bound(tmp_path_factory) -> list[dict]:
    """One 4-rank run of the worker with ``init_process_group("neuron", device_id=neuron:i)``."""
    outdir = tmp_path_factory.mktemp("device_id")
    proc = launch("init_variants.py", outdir, 4, "device_id")
    return results(outdir, 4, proc)


def test_init_process_group_without_a_backend_uses_neuron(tmp_path) -> None:
    proc = launch("init_variants.py", tmp_path, 2, "no_backend")
    values = assert_case(results(tmp_path, 2, proc), "no_backend_means_the_neuron_backend")
    assert values == ["neuron", "neuron"]


def test_gloo_subgroup_of_a_device_bound_group(core_bound) -> None:
    values = assert_case(core_bound, "gloo_subgroup_of_a_core_bound_group")
    assert values == [[10.0, 10.0]] * 4


def test_device_mesh_of_a_device_bound_group(core_bound) -> None:
    # mesh (2, 2): dp groups {0, 2} and {1, 3}, tp groups {0, 1} and {2, 3}; values are rank + 1
    values = assert_case(core_bound, "device_mesh_of_a_core_bound_group")
    assert values == [[4.0, 3.0], [6.0, 3.0], [4.0, 7.0], [6.0, 7.0]]


def test_new_group_leaving_ranks_out_of_a_device_bound_group(core_bound) -> None:
    values = assert_case(core_bound, "new_group_leaving_ranks_out_of_a_core_bound_group")
    assert values == [[3.0], [3.0], [None], [None]]


def test_split_group_of_a_device_bound_group(core_bound) -> None:
    values = assert_case(core_bound, "split_group_of_a_core_bound_group")
    assert values == [[3.0], [3.0], [None], [None]]


def test_bf16_hook_with_a_device_map_backend(tmp_path) -> None:
    proc = launch("init_variants.py", tmp_path, 2, "device_map")
    assert assert_case(results(tmp_path, 2, proc), "bf16_hook_on_a_device_map_backend") == [True, True]
