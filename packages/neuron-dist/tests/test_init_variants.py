"""Ways of starting the group: no backend, a device map, and CPU subgroups of a core-bound group (2 ranks)."""

from __future__ import annotations

from conftest import assert_case, launch, results


def test_init_process_group_without_a_backend_uses_neuron(tmp_path) -> None:
    proc = launch("init_variants.py", tmp_path, 2, "no_backend")
    values = assert_case(results(tmp_path, 2, proc), "no_backend_means_the_neuron_backend")
    assert values == ["neuron", "neuron"]


def test_gloo_subgroup_of_a_device_bound_group(tmp_path) -> None:
    proc = launch("init_variants.py", tmp_path, 2, "device_id")
    values = assert_case(results(tmp_path, 2, proc), "gloo_subgroup_of_a_core_bound_group")
    assert values == [[3.0, 3.0], [3.0, 3.0]]


def test_bf16_hook_with_a_device_map_backend(tmp_path) -> None:
    proc = launch("init_variants.py", tmp_path, 2, "device_map")
    assert assert_case(results(tmp_path, 2, proc), "bf16_hook_on_a_device_map_backend") == [True, True]
