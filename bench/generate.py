#!/usr/bin/env python
"""Static-cache ``generate`` on neuron: Dynamo traces, graphs and time per run, against the CPU.

For each architecture (tiny random models from configs, no hub), greedy generation of
``--tokens`` new tokens from a 5-token prompt, three ways in one process:

* **cpu eager**: ``generate`` on the CPU (the reference tokens);
* **neuron compiled, cold**: ``generate(cache_implementation="static")`` on neuron, which
  transformers compiles with the neuron backend; a fresh compile cache, so graphs compile here;
* **neuron compiled, warm**: the same again in the same process (executables in memory, Dynamo's
  guards already built): the steady per-token cost.

Printed per run: seconds, Dynamo traces (first trace + recompilations), neuron graphs and
compilations, and whether the tokens equal the CPU's. Sliding-window models (Mistral, Gemma 2)
keep their cache length in a Python int; ``llama`` has no sliding window and is the baseline.

    .venv/bin/python bench/generate.py                    # llama, mistral, gemma2; 20 tokens
    .venv/bin/python bench/generate.py --models mistral --tokens 40
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")

import torch  # noqa: E402

_COMMON = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)


def _model(name: str) -> torch.nn.Module:
    import transformers

    if name == "llama":
        config = transformers.LlamaConfig(**_COMMON)
        cls = transformers.LlamaForCausalLM
    elif name == "mistral":
        config = transformers.MistralConfig(**_COMMON, sliding_window=8)
        cls = transformers.MistralForCausalLM
    elif name == "gemma2":
        config = transformers.Gemma2Config(**_COMMON, head_dim=8, sliding_window=8)
        cls = transformers.Gemma2ForCausalLM
    else:
        raise SystemExit(f"unknown model {name!r}: choose llama, mistral or gemma2")
    torch.manual_seed(0)
    return cls(config).eval()


def _counts() -> dict[str, int]:
    from neuron_compile import metrics

    counters = metrics.counters()
    return {"traces": len(torch._dynamo.utils.get_compilation_metrics()), "graphs": counters["graphs"],
            "compilations": counters["compilations"]}


def _run(name: str, tokens: int) -> None:
    from neuron_compile import metrics

    model = _model(name)
    prompt = torch.randint(1, 128, (1, 5), generator=torch.Generator().manual_seed(1))
    options = dict(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
    with torch.no_grad():
        start = time.perf_counter()
        expected = model.generate(prompt, **options)
        print(f"{name:8s} cpu eager            {time.perf_counter() - start:6.2f} s")
        model.to("neuron")
        torch._dynamo.reset()
        torch._dynamo.utils.clear_compilation_metrics()
        metrics.reset()
        for label in ("neuron compiled, cold", "neuron compiled, warm"):
            start = time.perf_counter()
            out = model.generate(prompt.to("neuron"), cache_implementation="static", **options)
            seconds = time.perf_counter() - start
            counts = _counts()
            print(f"{name:8s} {label:21s} {seconds:6.2f} s  traces {counts['traces']:3d}  graphs "
                  f"{counts['graphs']:3d}  compilations {counts['compilations']:2d}  "
                  f"tokens equal cpu: {torch.equal(out.cpu(), expected)}")
            torch._dynamo.utils.clear_compilation_metrics()
            metrics.reset()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="llama,mistral,gemma2")
    parser.add_argument("--tokens", type=int, default=20)
    args = parser.parse_args()
    os.environ.setdefault("TORCH_NEURONX_NEFF_CACHE_DIR", tempfile.mkdtemp(prefix="neff-generate-"))
    import neuron_compile  # noqa: F401  (the backend; transformers picks it for neuron models)

    print(f"torch {torch.__version__}, {args.tokens} new tokens, cache {os.environ['TORCH_NEURONX_NEFF_CACHE_DIR']}")
    for name in args.models.split(","):
        _run(name.strip(), args.tokens)


if __name__ == "__main__":
    main()
