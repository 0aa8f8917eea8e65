"""attn_implementation="attngen" in Hugging Face transformers: small random-weight models built from
a config (no download), logits and gradients against the same model with "sdpa" ("eager" where sdpa
refuses softcap), by the flash-attn rule at model level:
|attngen(bf16) - ref(fp32)| <= 2 x |ref(bf16) - ref(fp32)| (3 x for gradients)."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from attngen.integrations import transformers as agt  # noqa: E402
from attngen.testing import assert_flash_rule  # noqa: E402


def _model(cls_name, config_name, ref="sdpa", **cfg):
    agt.register()
    config = getattr(transformers, config_name)(**cfg)
    torch.manual_seed(0)
    base = getattr(transformers, cls_name)(config).eval()
    out = {}
    for impl, dtype in ((ref, torch.float32), (ref, torch.bfloat16), ("attngen", torch.bfloat16)):
        m = copy.deepcopy(base).to(dtype)
        m.config._attn_implementation = impl
        for mod in m.modules():
            if hasattr(mod, "config"):
                mod.config._attn_implementation = impl
        out[("ref" if impl == ref else impl, dtype)] = m
    return out


def _run(models, ids, mask):
    res = {}
    for key, m in models.items():
        m.zero_grad()
        logits = m(input_ids=ids, attention_mask=mask).logits
        loss = logits.float().logsumexp(-1).mean() if mask is None else (logits.float().logsumexp(-1) * mask).mean()
        loss.backward()
        w = m.model.layers[0].self_attn.q_proj.weight.grad
        res[key] = (logits.float().detach(), w.float().clone())
    return res


def _check(res, name):
    ref = res[("ref", torch.float32)]
    pt = res[("ref", torch.bfloat16)]
    ours = res[("attngen", torch.bfloat16)]
    assert_flash_rule(f"{name}/logits", ours[0], ref[0], pt[0], 2.0)
    assert_flash_rule(f"{name}/q_proj.grad", ours[1], ref[1], pt[1], 3.0)


LLAMA = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)


def test_llama_causal_gqa():
    models = _model("LlamaForCausalLM", "LlamaConfig", **LLAMA)
    ids = torch.randint(0, 97, (2, 37), generator=torch.Generator().manual_seed(1))
    _check(_run(models, ids, None), "llama")


def test_llama_padding_goes_varlen():
    models = _model("LlamaForCausalLM", "LlamaConfig", **LLAMA)
    ids = torch.randint(0, 97, (3, 29), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(3, 29, dtype=torch.long)
    mask[0, :7] = 0  # left padding
    mask[2, :20] = 0
    res = _run(models, ids, mask)
    keep = mask.bool()
    _check({k: (v[0][keep], v[1]) for k, v in res.items()}, "llama-padded")


def test_gemma2_softcap_and_sliding_window():
    # transformers' sdpa path refuses softcap: the reference is its eager attention
    models = _model("Gemma2ForCausalLM", "Gemma2Config", ref="eager", vocab_size=97, hidden_size=64,
                    intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, sliding_window=8,
                    attn_logit_softcapping=5.0, final_logit_softcapping=None,
                    max_position_embeddings=128)
    ids = torch.randint(0, 97, (2, 33), generator=torch.Generator().manual_seed(3))
    _check(_run(models, ids, None), "gemma2")


def test_4d_mask_is_a_clear_error():
    q = torch.randn(1, 2, 5, 16).bfloat16()
    with pytest.raises(ValueError, match="^attention_mask: "):
        agt.attention_forward(torch.nn.Module(), q, q, q, torch.zeros(1, 1, 5, 5))
