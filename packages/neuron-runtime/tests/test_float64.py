"""float64 has no Trainium hardware support: counted and warned once, or refused."""

from __future__ import annotations


def test_float64_is_counted_and_warned_once(python_in_subprocess):
    result = python_in_subprocess(
        """
        import warnings, torch, torch_neuronx
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            x = torch.ones(3, dtype=torch.float64, device="neuron")
            y = (x * 2).sum()
            print(repr(y))
        f64 = [m for m in w if "float64" in str(m.message) or "Double" in str(m.message)]
        print("warnings", len(f64))
        ops = torch_neuronx.get_float64_ops()
        print("counted", any(k.startswith("aten::mul") for k in ops), sum(ops.values()) >= 2, ops)
        print("value", float(y))
        """
    )
    assert result.returncode == 0, result.stderr
    assert "warnings 1" in result.stdout
    assert "counted True True" in result.stdout and "value 6.0" in result.stdout


def test_strict_mode_refuses_float64_naming_the_op(python_in_subprocess):
    result = python_in_subprocess(
        """
        import torch
        x = torch.ones(3, device="neuron")
        try:
            x.double()
        except TypeError as e:
            print("refused", "aten::" in str(e), "float32" in str(e))
        print("still works", float((x + 1).sum()))
        """,
        env={"NEURON_EMU_FLOAT64": "error"},
    )
    assert result.returncode == 0, result.stderr
    assert "refused True True" in result.stdout and "still works 6.0" in result.stdout


def test_printing_float32_tensor_does_not_warn(python_in_subprocess):
    result = python_in_subprocess(
        """
        import warnings, torch
        warnings.simplefilter("error")
        print(torch.tensor([1.5, 2.0], device="neuron"))
        """,
        env={"NEURON_EMU_FLOAT64": "error"},
    )
    assert result.returncode == 0, result.stderr
    assert "device='neuron:0'" in result.stdout
