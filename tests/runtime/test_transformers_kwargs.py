"""The Hugging Face attention function's model-specific arguments, without transformers installed:
gpt-oss's learned sinks (`s_aux`) and Llama 4's chunked layers (config.attention_chunk_size on the
layers config.layer_types calls "chunked_attention") reach the kernels; other layers do not chunk."""

from __future__ import annotations

from types import SimpleNamespace

import torch

import attngen
from attngen.integrations import transformers as agt


def _qkv(seed):
    g = torch.Generator().manual_seed(seed)
    mk = lambda h: torch.randn(1, h, 40, 32, generator=g).to(torch.float16)  # noqa: E731
    return mk(4), mk(2), mk(2)


def test_sinks_pass_through():
    q, k, v = _qkv(0)
    sinks = torch.randn(4)
    module = SimpleNamespace(is_causal=True, training=False)
    out, _ = agt.attention_forward(module, q, k, v, None, scaling=0.125, s_aux=sinks)
    ref = attngen.attention(q, k, v, causal=True, scale=0.125, sinks=sinks).transpose(1, 2)
    assert torch.equal(out, ref)
    assert not torch.equal(out, attngen.attention(q, k, v, causal=True, scale=0.125).transpose(1, 2))


def test_llama4_chunked_layers():
    q, k, v = _qkv(1)
    config = SimpleNamespace(attention_chunk_size=16, layer_types=["chunked_attention", "full_attention"])
    chunked = SimpleNamespace(is_causal=True, training=False, config=config, layer_idx=0)
    full = SimpleNamespace(is_causal=True, training=False, config=config, layer_idx=1)
    out, _ = agt.attention_forward(chunked, q, k, v, None, scaling=0.2)
    ref = attngen.attention(q, k, v, causal=True, scale=0.2,
                            mask_mod=lambda b, h, qi, ki: qi // 16 == ki // 16).transpose(1, 2)
    assert torch.equal(out, ref)
    out_full, _ = agt.attention_forward(full, q, k, v, None, scaling=0.2)
    assert torch.equal(out_full, attngen.attention(q, k, v, causal=True, scale=0.2).transpose(1, 2))
