"""Instance profiles and the environment variables the runtime honours."""

from __future__ import annotations

import pytest

from neuron_runtime._config import load_config

GiB = 1 << 30


@pytest.mark.parametrize(
    "env, count, capacity",
    [
        ({}, 4, 24 * GiB),
        ({"NEURON_EMU_INSTANCE": "trn1"}, 2, 16 * GiB),
        ({"NEURON_LOGICAL_NC_CONFIG": "1"}, 8, 12 * GiB),
        ({"NEURON_EMU_INSTANCE": "trn1", "NEURON_EMU_CHIPS": "16"}, 32, 16 * GiB),
    ],
)
def test_instance_profiles(env, count, capacity):
    config = load_config(env)
    assert not config.error
    assert config.device_count == count and config.capacity_bytes == capacity


@pytest.mark.parametrize(
    "visible, expected",
    [("3", (3,)), ("0,2", (0, 2)), ("1-3", (1, 2, 3)), ("0-1,3", (0, 1, 3))],
)
def test_visible_cores_forms(visible, expected):
    assert load_config({"NEURON_RT_VISIBLE_CORES": visible}).visible_cores == expected


def test_num_cores_and_local_rank():
    config = load_config({"NEURON_RT_NUM_CORES": "2", "LOCAL_RANK": "1"})
    assert config.visible_cores == (0, 1) and config.initial_device == 1
    assert config.warning == ""


def test_a_process_that_sees_one_core_uses_it_whatever_its_local_rank():
    config = load_config({"NEURON_RT_VISIBLE_CORES": "3", "LOCAL_RANK": "3"})
    assert config.initial_device == 0 and config.warning == ""


def test_a_local_rank_past_the_visible_cores_is_warned_at_import(python_in_subprocess):
    # 8 ranks on a 4-core instance would all run here, ranks 4-7 on core 0; on Trainium they
    # would find no core of their own.
    result = python_in_subprocess(
        """
        import warnings
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            import torch
            print(torch.neuron.current_device())
        print([str(x.message) for x in w if issubclass(x.category, RuntimeWarning)])
        """,
        env={"LOCAL_RANK": "5"},
    )
    assert result.returncode == 0, result.stderr
    first, messages = result.stdout.split("\n", 1)
    assert first == "0"
    assert "LOCAL_RANK=5 is past the 4 NeuronCores" in messages
    assert "--nproc-per-node 4" in messages


@pytest.mark.parametrize(
    "env, fragment",
    [
        ({"NEURON_RT_VISIBLE_CORES": "abc"}, "NEURON_RT_VISIBLE_CORES='abc' is not valid"),
        ({"NEURON_RT_VISIBLE_CORES": "0-9"}, "indices below 4"),
        ({"NEURON_RT_NUM_CORES": "5"}, "has 4 logical cores"),
        ({"NEURON_RT_NUM_CORES": "x"}, "expected an integer"),
        ({"NEURON_LOGICAL_NC_CONFIG": "2", "NEURON_EMU_INSTANCE": "trn1"}, "supported values are 1"),
        ({"NEURON_LOGICAL_NC_CONFIG": "3"}, "supported values are 1, 2"),
        ({"NEURON_EMU_INSTANCE": "trn9"}, "choose one of"),
        ({"NEURON_EMU_FLOAT64": "maybe"}, "use warn, error or allow"),
        ({"NEURON_LAUNCH_BLOCKING": "yes please"}, "use 0 or 1"),
        ({"NEURON_RT_NUM_CORES": "1", "NEURON_RT_VISIBLE_CORES": "0"}, "set only one"),
    ],
)
def test_invalid_environment_is_reported(env, fragment):
    config = load_config(env)
    assert fragment in config.error
    assert config.device_count == 0


def test_invalid_environment_errors_at_use_not_import(python_in_subprocess):
    result = python_in_subprocess(
        """
        import warnings, torch
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            print("available", torch.neuron.is_available())
            print("warned", any("NEURON_RT_VISIBLE_CORES" in str(x.message) for x in w))
        try:
            torch.ones(1, device="neuron")
        except RuntimeError as e:
            print("error", "NEURON_RT_VISIBLE_CORES='zz' is not valid" in str(e))
        """,
        env={"NEURON_RT_VISIBLE_CORES": "zz"},
    )
    assert result.returncode == 0, result.stderr
    assert "available False" in result.stdout
    assert "warned True" in result.stdout and "error True" in result.stdout


def test_environment_reaches_the_runtime(python_in_subprocess):
    result = python_in_subprocess(
        """
        import torch
        print(torch.neuron.device_count(), torch.neuron.current_device(),
              torch.neuron.get_device_properties(0).physical_core,
              torch.neuron.get_device_properties(0).name)
        """,
        env={"NEURON_EMU_INSTANCE": "trn1", "NEURON_EMU_CHIPS": "2", "NEURON_RT_VISIBLE_CORES": "1-3",
             "LOCAL_RANK": "2"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["3", "2", "1", "NeuronCore-v2"]
