"""Tiny Hugging Face models built from configs (no downloads), for tests that need real architectures."""

from __future__ import annotations

import torch

FAMILIES = ("gpt2", "llama", "bert")

_SIZES = {"hidden_size": 32, "num_attention_heads": 2, "vocab_size": 64, "max_position_embeddings": 16}


def tiny_model(family: str, layers: int) -> torch.nn.Module:
    """A ``family`` model (GPT-2, Llama or BERT) of ``layers`` layers, hidden size 32, vocabulary 64,
    no dropout, seeded. Needs ``transformers`` (the test extra)."""
    import transformers  # the callers skip without it

    torch.manual_seed(0)
    if family == "gpt2":
        config = transformers.GPT2Config(n_layer=layers, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
        config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = 0.0
        return transformers.GPT2LMHeadModel(config)
    if family == "llama":
        config = transformers.LlamaConfig(num_hidden_layers=layers, intermediate_size=64, num_key_value_heads=2, **_SIZES)
        return transformers.LlamaForCausalLM(config)
    if family == "bert":
        config = transformers.BertConfig(
            num_hidden_layers=layers, intermediate_size=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **_SIZES
        )
        return transformers.BertForMaskedLM(config)
    raise ValueError(f"family: got {family!r}, expected one of {FAMILIES}")
