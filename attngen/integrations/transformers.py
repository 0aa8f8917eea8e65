"""Hugging Face transformers: `attn_implementation="attngen"`.

    import attngen.integrations.transformers as agt
    agt.register()
    model = AutoModelForCausalLM.from_config(config, attn_implementation="attngen")

Covers Llama-style decoder attention: causal (or not, per the module), GQA, sliding windows
(`sliding_window` of W keys = flash-attn window (W - 1, 0)), tanh softcapping, gpt-oss's
learned sinks (`s_aux`) where the model's attention passes them, and Llama 4's chunked layers
(config.attention_chunk_size on the layers config.layer_types calls "chunked_attention", as a
mask expression joining the causal mask). Padding masks: transformers hands over the 2-D (batch, keys) padding mask
(flash-attn's mask convention), and the call is routed to attngen.attention_varlen over the real
tokens; padded query rows come back as zeros. Dropout, and arbitrary 4-D masks, are a clear error.
"""

from __future__ import annotations

import torch

import attngen

NAME = "attngen"


def attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                      sliding_window=None, softcap=None, is_causal=None, **kwargs):
    """transformers' attention-function protocol: query (B, Hq, Sq, D), key/value (B, Hkv, Sk, D);
    returns (attn_output (B, Sq, Hq, D), None)."""
    if dropout and module.training:
        raise ValueError("attention dropout: attngen has no dropout; set the config's attention_dropout to 0")
    if kwargs.get("output_attentions"):
        raise ValueError("output_attentions: attngen never materializes the attention matrix")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    window = (int(sliding_window) - 1, 0 if causal else int(sliding_window) - 1) if sliding_window else (-1, -1)
    kw = dict(causal=bool(causal), window_size=window, softcap=float(softcap or 0.0), scale=scaling)
    if kwargs.get("s_aux") is not None:  # gpt-oss: its learned sinks, one logit per query head
        kw["sinks"] = kwargs["s_aux"]
    chunk = _chunk(module)
    if chunk:  # Llama 4's chunked layers: each query sees the keys of its own chunk
        kw["mask_mod"] = f"kv_idx // {chunk} == q_idx // {chunk}"
    if attention_mask is None:
        out = attngen.attention(query, key, value, **kw)
        return out.transpose(1, 2), None
    if attention_mask.dim() != 2 or attention_mask.dtype != torch.bool:
        raise ValueError(f"attention_mask: attngen takes the 2-D boolean padding mask that its mask "
                         f"function hands over, got {attention_mask.dtype} of shape "
                         f"{tuple(attention_mask.shape)}")
    return _padded(query, key, value, attention_mask, kw), None


def _chunk(module) -> int:
    """Llama 4's attention chunk (config.attention_chunk_size) where the module's layer is a
    "chunked_attention" one in config.layer_types; else 0."""
    config = getattr(module, "config", None)
    size = getattr(config, "attention_chunk_size", None)
    types = getattr(config, "layer_types", None)
    idx = getattr(module, "layer_idx", None)
    if not size or types is None or idx is None or idx >= len(types):
        return 0
    return int(size) if types[idx] == "chunked_attention" else 0


def _padded(query, key, value, mask, kw):
    B, Hq, Sq, D = query.shape
    Sk = key.shape[2]
    keys_ok = mask[:, -Sk:]
    rows_ok = keys_ok[:, -Sq:]
    q_idx = rows_ok.reshape(-1).nonzero().squeeze(1)
    k_idx = keys_ok.reshape(-1).nonzero().squeeze(1)
    cu = lambda ok: torch.nn.functional.pad(ok.sum(1).cumsum(0), (1, 0)).to(torch.int32)  # noqa: E731
    lens_q, lens_k = rows_ok.sum(1), keys_ok.sum(1)
    pack = lambda t, idx: t.transpose(1, 2).reshape(-1, t.shape[1], t.shape[3]).index_select(0, idx)  # noqa: E731
    out = attngen.attention_varlen(pack(query, q_idx), pack(key, k_idx), pack(value, k_idx), cu(rows_ok),
                                   cu(keys_ok), int(lens_q.max()), int(lens_k.max()), **kw)
    full = out.new_zeros(B * Sq, Hq, value.shape[3])
    full = full.index_copy(0, q_idx, out)
    return full.view(B, Sq, Hq, value.shape[3])


def register() -> None:
    """Make attn_implementation="attngen" known to transformers (attention and mask functions)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, flash_attention_mask

    AttentionInterface.register(NAME, attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, flash_attention_mask)
