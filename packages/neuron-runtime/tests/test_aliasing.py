"""Arguments that share memory behave as on the CPU: overlap errors, and aliasing that is allowed.

Every neuron op runs a CPU kernel on CPU views of its arguments. Views of one neuron storage
must share one CPU storage (and a tensor passed twice must be one CPU tensor), or the kernels'
overlap checks see unrelated tensors and write through aliases silently.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

_OVERLAP = "single memory location"


def _on(device: str) -> dict[str, torch.Tensor]:
    return {"a": torch.arange(8.0, device=device), "y": torch.randn(4, 6, generator=torch.Generator().manual_seed(0)).to(device),
            "z": torch.zeros(4, 6, device=device), "i": torch.tensor([1, 0], device=device),
            "empty": torch.zeros(0, device=device)}


def _shifted_copy(tensor: torch.Tensor) -> torch.Tensor:
    return tensor[1:].copy_(tensor[:-1])


REFUSED: dict[str, Callable[[dict[str, torch.Tensor]], object]] = {
    "add out= shifted input": lambda t: torch.add(t["a"][:4], 1, out=t["a"][1:5]),
    "cat out= over its inputs": lambda t: torch.cat([t["a"][:2], t["a"][2:4]], out=t["a"][:4]),
    "cat out= part of an input": lambda t: torch.cat([t["y"], t["z"]], out=t["z"][:2]),
    "cat out= is an empty input": lambda t: torch.cat([t["empty"], t["y"].flatten()], out=t["empty"]),
    "stack out= over its inputs": lambda t: torch.stack([t["a"][:2], t["a"][2:4]], out=t["a"][:4].view(2, 2)),
    "index_select out= its input": lambda t: torch.index_select(t["a"], 0, t["i"], out=t["a"][:2]),
    "index assignment from itself": lambda t: t["a"].__setitem__(torch.tensor([1, 2, 3]), t["a"][0:3]),
    "copy_ partial overlap": lambda t: t["a"][1:5].copy_(t["a"][:4]),
    "large copy_ partial overlap": lambda t: _shifted_copy(torch.zeros(1 << 16, device=t["a"].device)),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_overlapping_arguments_are_refused_as_on_cpu(case: str) -> None:
    with pytest.raises(RuntimeError, match=_OVERLAP):
        REFUSED[case](_on("cpu"))
    tensors = _on("neuron")
    before = {name: t.cpu().clone() for name, t in tensors.items()}
    with pytest.raises(RuntimeError, match=_OVERLAP):
        REFUSED[case](tensors)
    for name, tensor in tensors.items():
        assert torch.equal(tensor.cpu(), before[name]), f"{case} wrote to {name} before refusing"


ALLOWED: dict[str, Callable[[dict[str, torch.Tensor]], object]] = {
    "add out= an input": lambda t: torch.add(t["a"], t["a"], out=t["a"]),
    "mul_ by itself": lambda t: t["a"].mul_(t["a"]),
    "copy_ between disjoint halves": lambda t: t["a"][::2].copy_(t["a"][1::2]),
    "copy_ onto the same elements": lambda t: t["a"][2:6].copy_(t["a"][2:6]),
    "addcmul_ with its own slices": lambda t: t["y"][:2].addcmul_(t["y"][2:], t["y"][2:], value=0.5),
    "index_copy_ from another part": lambda t: t["a"][:4].index_copy_(0, torch.tensor([3, 0], device=t["a"].device), t["a"][6:]),
}


@pytest.mark.parametrize("case", sorted(ALLOWED))
def test_allowed_aliasing_gives_the_cpu_values(case: str) -> None:
    cpu, neuron = _on("cpu"), _on("neuron")
    ALLOWED[case](cpu)
    ALLOWED[case](neuron)
    for name in cpu:
        assert neuron[name].device.type == "neuron"
        assert torch.equal(neuron[name].cpu(), cpu[name]), name
