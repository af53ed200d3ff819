"""Small, offline building blocks for tests and examples: a tiny Llama, a local tokenizer, text.

Nothing here touches the Hugging Face Hub: the model is built from a config with random
weights, the tokenizer is trained on a few sentences. Importing this module imports
transformers and tokenizers.
"""

from __future__ import annotations

import os

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

__all__ = ["SENTENCES", "save_tiny_llama", "tiny_llama", "tiny_llama_config", "tiny_tokenizer"]

SENTENCES: tuple[str, ...] = (
    "the neuron core runs the model on the emulated trainium device",
    "a small language model learns to predict the next word",
    "training on the device matches training on the cpu",
    "the compiler turns one graph into one program per input shape",
    "each core has its own high bandwidth memory",
    "checkpoints save the model the optimizer the scheduler and the random state",
    "tensor parallel training splits each layer across cores",
    "the tokenizer maps words to ids and ids back to words",
)


def tiny_llama_config(**overrides: object) -> LlamaConfig:
    """Llama with hidden size 64, 2 layers, 4 heads, 2 KV heads and a 256-token vocabulary."""
    values: dict[str, object] = dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=256, max_position_embeddings=512,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    values.update(overrides)
    return LlamaConfig(**values)


def tiny_llama(seed: int = 0, **overrides: object) -> LlamaForCausalLM:
    """A randomly initialised tiny Llama on the CPU (same seed, same weights)."""
    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_llama_config(**overrides))


def save_tiny_llama(directory: str | os.PathLike[str], seed: int = 0, **overrides: object) -> str:
    """Saves :func:`tiny_llama` and :func:`tiny_tokenizer` to ``directory`` (a from_pretrained path)."""
    directory = os.fspath(directory)
    tiny_llama(seed, **overrides).save_pretrained(directory)
    tiny_tokenizer().save_pretrained(directory)
    return directory


def tiny_tokenizer(sentences: tuple[str, ...] = SENTENCES) -> PreTrainedTokenizerFast:
    """A word-level tokenizer trained on ``sentences`` (ids < 256; pad 0, bos 1, eos 2, unk 3)."""
    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["<pad>", "<s>", "</s>", "<unk>"], vocab_size=256)
    tokenizer.train_from_iterator(sentences, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>",
    )
