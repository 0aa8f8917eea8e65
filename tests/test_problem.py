"""attngen.problem: one Problem's inputs, counts and reference agree across layouts, packed
documents and query-row chunks, and with plain per-document attention_ref calls."""

from __future__ import annotations

import pytest
import torch

from attngen.problem import Problem, attended_pairs, attention_ref, keep_mask

MASKS = [dict(), dict(causal=True), dict(window=(5, 2)), dict(causal=True, window=(7, 0), top_left=True),
         dict(causal=True, softcap=5.0)]


@pytest.mark.parametrize("mask", MASKS, ids=lambda m: "-".join(f"{k}{v}" for k, v in m.items()) or "full")
def test_layouts_and_chunks_give_one_reference(mask):
    p = Problem(2, 6, 2, 23, 31, 16, 8, dtype="fp16", **mask)
    q, k, v = p.make_inputs(seed=3)
    out, lse = p.reference(q, k, v)
    assert out.dtype == torch.float64 and out.shape == (2, 6, 23, 8) and lse.shape == (2, 6, 23)
    want, want_lse = attention_ref(q, k, v, causal=p.causal, window_size=p.window, softcap=p.softcap,
                                   top_left=p.top_left)
    torch.testing.assert_close(out, want, rtol=0, atol=0, msg="reference differs from attention_ref")
    torch.testing.assert_close(lse, want_lse, rtol=0, atol=0)
    chunked, chunked_lse = p.reference(q, k, v, max_scores=2 * 6 * 31 * 4)  # 4 query rows a step
    torch.testing.assert_close(chunked, out, rtol=0, atol=1e-12, msg="chunked reference differs")
    torch.testing.assert_close(chunked_lse, lse, rtol=0, atol=1e-12)
    bshd = Problem(2, 6, 2, 23, 31, 16, 8, dtype="fp16", layout="bshd", **mask)
    t_out, t_lse = bshd.reference(*(x.transpose(1, 2) for x in (q, k, v)))
    torch.testing.assert_close(t_out.transpose(1, 2), out, rtol=0, atol=0, msg="bshd differs from bhsd")
    torch.testing.assert_close(t_lse, lse, rtol=0, atol=0)
    assert p.pairs() == 2 * int(keep_mask(23, 31, p.causal, p.window, p.top_left).sum())
    assert p.flops() == 2 * (16 + 8) * 6 * p.pairs()


@pytest.mark.parametrize("mask", MASKS[:4], ids=["full", "causal", "window", "top_left"])
def test_packed_documents_match_one_call_per_document(mask):
    lens_q, lens_k = [5, 1, 17, 9], [8, 0, 17, 3]
    p = Problem.packed_documents(lens_q, lens_k, heads_q=4, heads_kv=2, head_dim_qk=16, head_dim_v=16, **mask)
    q, k, v = p.make_inputs(seed=7)
    assert q.shape == (32, 4, 16) and k.shape == (28, 2, 16)
    cu_q, cu_k = p.cu_seqlens()
    assert cu_q.tolist() == [0, 5, 6, 23, 32] and cu_k.tolist() == [0, 8, 8, 25, 28]
    assert cu_q.dtype == torch.int32
    out, lse = p.reference(q, k, v)
    bh = lambda x: x.transpose(0, 1).unsqueeze(0)  # noqa: E731
    for i in range(len(lens_q)):
        sq, sk = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
        o, l = attention_ref(bh(q[sq]), bh(k[sk]), bh(v[sk]), causal=p.causal, window_size=p.window,
                             top_left=p.top_left)
        torch.testing.assert_close(out[sq], o[0].transpose(0, 1), rtol=0, atol=1e-12, msg=f"document {i}")
        torch.testing.assert_close(lse[:, sq], l[0], rtol=0, atol=1e-12, msg=f"document {i} lse")
    assert p.pairs() == sum(attended_pairs(a, b, p.causal, p.window, p.top_left) for a, b in zip(lens_q, lens_k))
    assert p.pairs() == int(p.keep().sum())


def test_benchmark_convention_counts_half_a_plain_causal_square():
    p = Problem(3, 4, 4, 64, 64, 32, 32, causal=True)
    assert p.pairs(exact=False) == 3 * 64 * 64 / 2
    assert p.pairs() == 3 * 64 * 65 // 2
    assert Problem(3, 4, 4, 64, 64, 32, 32).pairs(exact=False) == p.pairs(exact=False) * 2


def test_problem_refuses_what_it_cannot_be():
    with pytest.raises(ValueError, match="layout"):
        Problem(1, 4, 2, 8, 8, 16, 16, layout="bsdh")
    with pytest.raises(ValueError, match="multiple of heads_kv"):
        Problem(1, 5, 2, 8, 8, 16, 16)
    with pytest.raises(ValueError, match="packed"):
        Problem(1, 4, 2, 8, 8, 16, 16, documents=((8, 8),))
