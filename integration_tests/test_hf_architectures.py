"""A representative subset of the architecture coverage run (``python -m neuron_hf.coverage``).

Dense attention (llama, gpt2, mistral, qwen2, gemma, phi, bloom, opt), mixture of experts
(mixtral), and state-space/convolution (mamba) plus falcon: each built tiny from its default
config with the same weights on both devices, then forward, backward and static-cache greedy
generate on neuron compared with the CPU.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from neuron_hf.coverage import render_markdown, run_architecture, tiny_config

pytestmark = pytest.mark.filterwarnings("ignore")

_SUBSET = ["llama", "gpt2", "mistral", "mixtral", "qwen2", "gemma", "phi", "falcon", "mamba", "bloom", "opt"]


@pytest.mark.parametrize("arch", _SUBSET)
def test_architecture_matches_cpu(arch):
    result = run_architecture(arch)
    assert result.cpu == "ok", result.detail
    assert result.params < 2_000_000, "the config was not shrunk"
    assert result.neuron == "ok", result.neuron_detail


def test_tiny_config_shrinks_the_size_fields():
    config = tiny_config("mixtral")
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (64, 2, 4)
    assert (config.num_key_value_heads, config.vocab_size, config.num_local_experts) == (2, 256, 4)
    assert tiny_config("gpt2").n_embd == 64


def test_report_counts_only_architectures_working_on_the_cpu():
    from neuron_hf.coverage import ArchResult

    results = [ArchResult("a", cpu="ok", neuron="ok"), ArchResult("b", cpu="ok", neuron="mismatch"),
               ArchResult("c", cpu="fail", detail="config does not build")]
    text = render_markdown(results, "python -m neuron_hf.coverage a b c", compiled=False)
    assert "neuron eager: **1/2**" in text and "| c |" in text and "config does not build" in text


def test_comparison_flags_differences():
    import torch

    from neuron_hf.coverage import _compare

    logits, grads, tokens = torch.randn(2, 8, 16), {"w": torch.randn(4, 4)}, [[1, 2, 3]]
    assert _compare((logits, grads, tokens), (logits.clone(), {"w": grads["w"].clone()}, [[1, 2, 3]]))[0] == "ok"
    bumped = logits.clone()
    bumped[0, 0, 0] += 1e-2
    assert _compare((logits, grads, tokens), (bumped, grads, tokens))[0] == "mismatch"
    assert _compare((logits, grads, tokens), (logits, {"w": grads["w"] * 1.01}, tokens))[0] == "mismatch"
    assert _compare((logits, grads, tokens), (logits, grads, [[1, 2, 4]]))[0] == "mismatch"
    assert _compare((logits, grads, tokens), (logits, {}, tokens))[0] == "mismatch"
    # an all-zero gradient where eager has none (compiled graphs) is "no gradient" ...
    zero = {"w": grads["w"], "pooler": torch.zeros(3)}
    assert _compare((logits, grads, tokens), (logits, zero, tokens))[0] == "ok"
    # ... a non-zero one is not
    assert _compare((logits, grads, tokens), (logits, {**zero, "pooler": torch.ones(3)}, tokens))[0] == "mismatch"


def test_resume_journal_skips_recorded_architectures(tmp_path):
    from neuron_hf.coverage import ArchResult, _journal_writer, _load_journal

    journal = tmp_path / "cov.jsonl"
    _journal_writer(str(journal), compiled=True)(ArchResult("llama", cpu="ok", neuron="ok", compiled="ok"))
    _journal_writer(str(journal), compiled=False)(ArchResult("gpt2", cpu="ok", neuron="ok"))
    with open(journal, "a") as f:
        f.write('{"arch": "opt", "cpu": "o')  # a run killed mid-write
    done = _load_journal(str(journal), compiled=True)
    assert list(done) == ["llama"] and done["llama"].compiled == "ok"
    assert list(_load_journal(str(journal), compiled=False)) == ["gpt2"]
    assert _load_journal(str(tmp_path / "missing.jsonl"), compiled=True) == {}


def test_report_only_renders_the_journal_without_running(tmp_path):
    from neuron_hf.coverage import ArchResult, _journal_writer, main

    journal, output = tmp_path / "cov.jsonl", tmp_path / "cov.md"
    _journal_writer(str(journal), compiled=True)(ArchResult("llama", cpu="ok", neuron="ok", compiled="ok"))
    assert main(["llama", "gpt2", "--compiled", "--resume", str(journal), "--report-only", "--output", str(output)]) == 0
    text = output.read_text()
    assert "| llama |" in text and "| gpt2 |" not in text
    assert "1 not run yet: gpt2" in text and "neuron compiled (`torch.compile(backend=\"neuron\")`): **1/1**" in text
