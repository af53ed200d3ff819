"""PEFT LoRA on neuron: training matches the CPU, adapters save and load back onto the device."""

from __future__ import annotations

import copy
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model

from neuron_hf.testing import tiny_llama

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")

_DATA = torch.randint(4, 256, (5, 4, 17), generator=torch.Generator().manual_seed(0))


def _lora_model():
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "down_proj"])
    torch.manual_seed(1)
    model = get_peft_model(tiny_llama(seed=2), config)
    for name, p in model.named_parameters():
        if "lora_B" in name:  # B starts at zero: give the adapter something to say before training
            torch.nn.init.normal_(p, std=0.02)
    return model


def _train(model, device: str) -> list[float]:
    model.to(device)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for batch in _DATA:
        batch = batch.to(device)
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def _lora_state(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().cpu() for n, p in model.named_parameters() if "lora_" in n}


def test_lora_training_matches_cpu_and_trains_only_the_adapter():
    cpu_model = _lora_model()
    neuron_model = copy.deepcopy(cpu_model)
    base_before = {n: p.detach().clone() for n, p in cpu_model.named_parameters() if "lora_" not in n}
    cpu_losses = _train(cpu_model, "cpu")
    neuron_losses = _train(neuron_model, "neuron")
    torch.testing.assert_close(neuron_losses, cpu_losses, rtol=1e-5, atol=1e-5)
    assert neuron_losses[-1] < neuron_losses[0]
    torch.testing.assert_close(_lora_state(neuron_model), _lora_state(cpu_model), rtol=1e-4, atol=1e-5)
    for n, p in neuron_model.named_parameters():
        if "lora_" not in n:
            assert torch.equal(p.detach().cpu(), base_before[n]), n


def test_adapter_save_and_load_on_neuron(tmp_path):
    trained = _lora_model()
    _train(trained, "neuron")
    trained.save_pretrained(tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    x = _DATA[0].to("neuron")
    with torch.no_grad():
        expected = trained(input_ids=x).logits.cpu()

    base = tiny_llama(seed=2).to("neuron")
    loaded = PeftModel.from_pretrained(base, tmp_path / "adapter")
    assert {p.device.type for p in loaded.parameters()} == {"neuron"}
    torch.testing.assert_close(_lora_state(loaded), _lora_state(trained), rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=x).logits.cpu(), expected, rtol=1e-5, atol=1e-5)

    # A second adapter straight onto a chosen core's model, then merged into the base weights.
    loaded.load_adapter(tmp_path / "adapter", adapter_name="again", torch_device="neuron:0")
    loaded.set_adapter("again")
    merged = loaded.merge_and_unload()
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=x).logits.cpu(), expected, rtol=1e-4, atol=1e-4)


def _adalora_on(device: str):
    from peft import AdaLoraConfig

    config = AdaLoraConfig(init_r=4, target_r=2, total_step=10, target_modules=["q_proj", "v_proj"],
                           lora_dropout=0.0, init_lora_weights=False)
    torch.manual_seed(1)
    return get_peft_model(tiny_llama(seed=2).to(device), config)  # adapters built on the CPU, moved to the base's device


def test_adalora_keeps_its_frozen_parameters_frozen_and_trains_as_on_cpu():
    # PEFT re-wraps an adapter parameter moved across devices in a new Parameter that requires
    # grad, so on neuron AdaLoRA's frozen ``ranknum`` (the scaling's denominator) was trained.
    neuron, cpu = _adalora_on("neuron"), _adalora_on("cpu")
    trainable = lambda model: sorted(n for n, p in model.named_parameters() if p.requires_grad)  # noqa: E731
    assert trainable(neuron) == trainable(cpu)
    assert not any("ranknum" in name for name in trainable(neuron))
    ranknum = {n: p.detach().cpu().clone() for n, p in neuron.named_parameters() if "ranknum" in n}
    assert ranknum and all(p.device.type == "neuron" for n, p in neuron.named_parameters() if "ranknum" in n)
    torch.testing.assert_close(_train(neuron, "neuron"), _train(cpu, "cpu"), rtol=1e-4, atol=1e-5)
    for name, p in neuron.named_parameters():
        if name in ranknum:
            assert torch.equal(p.detach().cpu(), ranknum[name]), name
