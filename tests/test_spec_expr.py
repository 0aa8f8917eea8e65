"""The spec language's expressions: named masks and score modifications (attngen.spec.named) checked
against hand-written PyTorch semantics, the shipped expression specs, and the loader's errors (every
problem at once, naming file, entry, field and the offending part; nothing written). No kernels."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml

from attngen.env import REPO_ROOT
from attngen.spec import KernelSpec, SpecError, load_spec
from attngen.spec import expr as X
from attngen.spec.expr_eval import eval_torch
from attngen.spec import named as N

SPECS_DIR = REPO_ROOT / "specs"
GOOD = {"name": "k0", "head_dim": 64, "num_q_heads": 8, "num_kv_heads": 2, "mask": "causal",
        "dtypes": ["bf16"], "targets": ["sm90"], "families": ["fwd"]}


def write_spec(tmp_path: Path, doc, name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False))
    return path


def entry(**changes) -> dict:
    return {**GOOD, **changes}


def load_entry(tmp_path: Path, **changes):
    (e,) = load_spec(write_spec(tmp_path, {"kernels": [entry(**changes)]})).entries
    return e


def problems_of(tmp_path: Path, *entries) -> tuple[Path, list[str]]:
    path = write_spec(tmp_path, {"kernels": [GOOD, *entries]})
    with pytest.raises(SpecError) as info:
        load_spec(path)
    return path, info.value.problems


# --------------------------------------------------------------------------------------------------
# the named table against hand-written semantics

SQ, SK = 37, 53  # more keys than queries: q_idx = row + (SK - SQ) (bottom-right alignment)
ROWS = torch.arange(SQ)[:, None]
COLS = torch.arange(SK)[None, :]
D = SK - SQ


def env(b=0, h=0, score=None):
    return {"q_idx": ROWS + D, "kv_idx": COLS, "b": torch.tensor(b), "h": torch.tensor(h),
            "seqlen_q": SQ, "seqlen_k": SK, "score": torch.zeros(SQ, SK, dtype=torch.float64) if score is None else score}


def mask_of(name, params=None, b=0, **constants):
    m, _, _ = N.nodes(N.NAMED[name], constants)
    return torch.broadcast_to(torch.as_tensor(eval_torch(m, env(b=b), params or {}), dtype=torch.bool), (SQ, SK))


def test_builtin_masks_are_the_templates_semantics():
    """causal: key j for query row i when j <= i + d; sliding window W: i + d - (W - 1) <= j <= i + d."""
    ones = torch.ones(SQ, SK, dtype=torch.bool)
    assert torch.equal(mask_of("none"), ones)
    assert torch.equal(mask_of("causal"), ones.tril(D))
    for w in (1, 5, 16):
        assert torch.equal(mask_of("sliding_window", left=w - 1, right=0), ones.tril(D) & ones.triu(D - (w - 1))), w
    assert torch.equal(mask_of("sliding_window", left=3, right=2), ones.tril(D + 2) & ones.triu(D - 3))
    assert torch.equal(mask_of("gpt_oss_swa"), ones.tril(D) & ones.triu(D - 127))
    assert [N.NAMED[n].builtin for n in ("none", "causal", "sliding_window", "softcap")] == [
        "none", "causal", "sliding_window", "softcap"]


def test_softcap_score():
    s = torch.linspace(-200, 200, SQ * SK, dtype=torch.float64).reshape(SQ, SK)
    _, node, _ = N.nodes(N.NAMED["softcap"], {"cap": 50})
    torch.testing.assert_close(eval_torch(node, env(score=s), {}), 50 * torch.tanh(s / 50))


def test_chunked_is_causal_inside_chunks():
    want = torch.zeros(SQ, SK, dtype=torch.bool)
    for i in range(SQ):
        pos = i + D
        start = (pos // 8) * 8
        want[i, start:pos + 1] = True
    assert torch.equal(mask_of("chunked", chunk=8), want)


def test_prefix_lm_sees_the_prefix_of_its_batch_row():
    prefix = torch.tensor([0, 20, 53], dtype=torch.int32)
    for b, n in enumerate(prefix.tolist()):
        want = torch.ones(SQ, SK, dtype=torch.bool).tril(D)
        want[:, :n] = True
        assert torch.equal(mask_of("prefix_lm", {"prefix_len": prefix}, b=b), want), b


def test_sink_window_keeps_sinks_and_a_window():
    want = torch.zeros(SQ, SK, dtype=torch.bool)
    for i in range(SQ):
        pos = i + D
        want[i, :min(4, pos + 1)] = True
        want[i, max(0, pos - 9):pos + 1] = True
    assert torch.equal(mask_of("sink_window", sink_tokens=4, window=10), want)


def test_alibi_subtracts_slope_times_distance():
    slopes = torch.tensor([2 ** (-8 * (h + 1) / 16) for h in range(16)], dtype=torch.float64)
    s = torch.randn(SQ, SK, dtype=torch.float64)
    m, node, params = N.nodes(N.NAMED["alibi"])
    assert params == {"slope": X.ParamDecl("slope", ("h",), "fp32")}
    for h in (0, 5, 15):
        got = eval_torch(node, env(h=h, score=s), {"slope": slopes})
        torch.testing.assert_close(got, s - slopes[h] * (ROWS + D - COLS).abs().double())
    assert torch.equal(torch.as_tensor(eval_torch(m, env(), {})), (COLS <= ROWS + D))


def t5_relative_position_bucket(relative_position, bidirectional=True, num_buckets=32, max_distance=128):
    """T5's _relative_position_bucket, transcribed (relative_position = memory - query position)."""
    relative_buckets = 0
    if bidirectional:
        num_buckets //= 2
        relative_buckets += (relative_position > 0).to(torch.long) * num_buckets
        relative_position = torch.abs(relative_position)
    else:
        relative_position = -torch.min(relative_position, torch.zeros_like(relative_position))
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    relative_position_if_large = max_exact + (
        torch.log(relative_position.float() / max_exact) / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)).to(torch.long)
    relative_position_if_large = torch.min(relative_position_if_large,
                                           torch.full_like(relative_position_if_large, num_buckets - 1))
    relative_buckets += torch.where(is_small, relative_position, relative_position_if_large)
    return relative_buckets


@pytest.mark.parametrize("num_buckets, max_distance", [(32, 128), (16, 64), (64, 256)])
def test_t5_bias_buckets_match_t5(num_buckets, max_distance):
    n = 700  # past max_distance both ways
    q, k = torch.arange(n)[:, None], torch.arange(n)[None, :]
    bias = torch.randn(12, num_buckets, dtype=torch.float64)
    _, node, params = N.nodes(N.NAMED["t5_bias"], {"num_buckets": num_buckets, "max_distance": max_distance})
    assert params["bias"] == X.ParamDecl("bias", ("h", num_buckets), "fp32", learnable=True)
    want_bucket = t5_relative_position_bucket(k - q, num_buckets=num_buckets, max_distance=max_distance)
    assert int(want_bucket.max()) == num_buckets - 1
    s = torch.randn(n, n, dtype=torch.float64)
    for h in (0, 11):
        e = {"q_idx": q, "kv_idx": k, "b": 0, "h": torch.tensor(h), "seqlen_q": n, "seqlen_k": n, "score": s}
        torch.testing.assert_close(eval_torch(node, e, {"bias": bias}), s + bias[h][want_bucket], rtol=0, atol=0)


def test_named_texts_parse_and_round_trip():
    for v in N.NAMED.values():
        consts = {c.name: c.default if c.default is not None else 7 for c in v.constants}
        m, s, params = N.nodes(v, consts)
        for node, kind in ((m, "mask"), (s, "score")):
            if node is not None:
                text = X.to_text(node)
                assert X.to_text(X.parse(text, kind, params)) == text, (v.name, text)


# --------------------------------------------------------------------------------------------------
# the shipped specs

def test_gpt_oss_20b():
    sliding, full = load_spec(SPECS_DIR / "gpt_oss_20b.yaml").entries
    assert (sliding.mask, sliding.window, sliding.sinks, sliding.mask_expr) == ("sliding_window", 128, True, "")
    assert (full.mask, full.sinks, full.gqa_ratio, full.head_dim_qk) == ("causal", True, 8, 64)
    uris = [k.uri for k in sliding.kernel_specs()]
    # fwd, bwd and decode x 2 dtypes x 2 targets
    assert len(uris) == 12 and all("_swa_sinks_x" in u for u in uris), uris
    assert all(k.sinks and k.mask == "causal" for k in full.kernel_specs())


def test_paged_prefill_takes_no_expressions(tmp_path):
    """A default family list leaves prefill_paged out of an entry with expressions or sinks (the
    other families stay); naming it there is an error on the families field."""
    e = load_entry(tmp_path, mask="chunked", chunk=64, families=None)
    assert "prefill_paged" in e.families and {k.family for k in e.kernel_specs()} == {"fwd", "bwd", "decode"}
    assert "prefill_paged" in {k.family for k in load_entry(tmp_path, families=None).kernel_specs()}
    path, problems = problems_of(tmp_path, entry(name="x", sinks="learned", families=["fwd", "prefill_paged"]))
    assert problems == [f"{path}: kernel 'x' (entry 1): field 'families': prefill_paged: spec files do not build "
                        "paged prefill kernels with expressions or sinks yet (mask, score_mod, sinks; "
                        "attention_varlen renders them on first use); leave it out of this entry's families"]


def test_llama4_scout():
    chunked, glob = load_spec(SPECS_DIR / "llama4_scout.yaml").entries
    assert chunked.mask == "none" and chunked.gqa_ratio == 5 and chunked.head_dim_qk == 128
    assert chunked.mask_expr == "((kv_idx <= q_idx) and ((q_idx // 8192) == (kv_idx // 8192)))"
    assert {k.family for k in chunked.kernel_specs()} == {"fwd", "bwd", "decode"}
    assert glob.mask == "causal" and not glob.mask_expr
    assert [k.uri for k in glob.kernel_specs()][0] == "attn_fwd_bf16_hd128_gqa5_causal_sm80"


def test_gemma3_prefix_lm():
    (e,) = load_spec(SPECS_DIR / "gemma3_prefix_lm.yaml").entries
    assert (e.mask, e.gqa_ratio, e.head_dim_qk, e.softmax_scale) == ("none", 2, 256, 0.0625)
    assert e.mask_expr == "((kv_idx <= q_idx) or (kv_idx < prefix_len[b]))"
    assert e.params == (X.ParamDecl("prefix_len", ("b",), "int32"),)


def test_t5_base():
    (e,) = load_spec(SPECS_DIR / "t5_base.yaml").entries
    assert (e.mask, e.gqa_ratio, e.softmax_scale, e.mask_expr) == ("none", 1, 1.0, "")
    assert e.params == (X.ParamDecl("bias", ("h", 32), "fp32", learnable=True),)
    assert e.score_expr.startswith("(score + bias[h, ") and "2.772588722239781" in e.score_expr


def test_bloom_alibi():
    (e,) = load_spec(SPECS_DIR / "bloom_alibi.yaml").entries
    assert (e.mask, e.gqa_ratio, e.head_dim_qk) == ("causal", 1, 64)
    assert e.score_expr == "(score - (slope[h] * abs((q_idx - kv_idx))))"
    assert e.params == (X.ParamDecl("slope", ("h",), "fp32"),)


def test_uris_are_deterministic_and_distinct():
    a = [k.uri for f in sorted(SPECS_DIR.glob("*.yaml")) for k in load_spec(f).kernel_specs()]
    b = [k.uri for f in sorted(SPECS_DIR.glob("*.yaml")) for k in load_spec(f).kernel_specs()]
    assert a == b
    x = [k for f in sorted(SPECS_DIR.glob("*.yaml")) for k in load_spec(f).kernel_specs() if k.has_expr]
    assert len({k.uri for k in x}) == len(x) > 0
    # the same expression written by hand gives the same kernel as the named variant
    chunked = load_spec(SPECS_DIR / "llama4_scout.yaml").entries[0].kernel_specs()[0]
    by_hand = chunked.replace(mask_expr=X.to_text(X.parse("kv_idx <= q_idx and q_idx // 8192 == kv_idx // 8192",
                                                          "mask")))
    assert by_hand.uri == chunked.uri


def test_expression_entry_equals_named(tmp_path):
    named = load_entry(tmp_path, mask="prefix_lm")
    by_hand = load_entry(tmp_path, mask={"expr": "kv_idx <= q_idx or kv_idx < prefix_len[b]"},
                         params={"prefix_len": {"shape": ["b"], "dtype": "int32"}})
    assert [k.uri for k in named.kernel_specs()] == [k.uri for k in by_hand.kernel_specs()]


def test_builtin_masks_still_give_the_same_kernels(tmp_path):
    """mask: causal / sliding_window / none / document: no expression fields, the uris of before."""
    for changes, uri in (({}, "attn_fwd_bf16_hd64_gqa4_causal_sm90"),
                         ({"mask": "none"}, "attn_fwd_bf16_hd64_gqa4_full_sm90"),
                         ({"mask": "sliding_window", "window": 64}, "attn_fwd_bf16_hd64_gqa4_swa_sm90"),
                         ({"mask": "document"}, "attn_fwd_bf16_hd64_gqa4_doc_causal_sm90")):
        (k,) = load_entry(tmp_path, **changes).kernel_specs()
        assert k.uri == uri and not k.has_expr and k == KernelSpec(
            family="fwd", dtype="bf16", target="sm90", head_dim_qk=64, head_dim_v=64, gqa_ratio=4,
            mask=k.mask, varlen=changes.get("mask") == "document")


def test_lets_and_learnable_params(tmp_path):
    e = load_entry(tmp_path, mask={"expr": "near"}, score_mod={"expr": "score + w[h, min(d, 15)] * s"},
                   let={"d": "abs(q_idx - kv_idx)", "near": "d < 100"},
                   params={"w": {"shape": ["h", 16], "learnable": True}, "s": {"shape": [], "dtype": "bf16"}},
                   sinks="learned")
    assert e.mask_expr == "(abs((q_idx - kv_idx)) < 100)"
    assert e.score_expr == "(score + (w[h, min(abs((q_idx - kv_idx)), 15)] * s))"
    assert e.params == (X.ParamDecl("s", (), "bf16"), X.ParamDecl("w", ("h", 16), "fp32", True))
    assert e.sinks and all(k.sinks for k in e.kernel_specs())


def test_named_param_may_change_learnable(tmp_path):
    e = load_entry(tmp_path, score_mod="alibi", params={"slope": {"shape": ["h"], "learnable": True}})
    assert e.params == (X.ParamDecl("slope", ("h",), "fp32", True),)


# --------------------------------------------------------------------------------------------------
# errors: every problem at once, naming file, entry, field and the offending part

BAD_ROWS = [
    ({"mask": {"expr": "kv_idx <= q_idxx"}}, "mask", "'q_idxx': unknown name 'q_idxx'"),
    ({"mask": {"expr": "kv_idx + 1"}}, "mask", "a mask must be a boolean expression"),
    ({"mask": {"expr": "kv_idx <= (q_idx"}}, "mask", "syntax error"),
    ({"mask": {"exp": "kv_idx <= q_idx"}}, "mask", "an expression is written {expr:"),
    ({"mask": {"expr": "kv_idx < s"}, "let": {"s": "score"}}, "mask", "a mask cannot use score"),
    ({"score_mod": {"expr": "score ** 2"}}, "score_mod", "'score ** 2': operator Pow is not allowed"),
    ({"score_mod": {"expr": "q_idx < 3"}}, "score_mod", "a score modification must be a number"),
    ({"score_mod": "rope"}, "score_mod", "must be one of alibi, t5_bias or {expr: ...}, got 'rope'"),
    ({"score_mod": "softcap"}, "score_mod", "write `softcap: <cap>`"),
    ({"score_mod": "alibi", "softcap": 30.0}, "score_mod", "replaces softcapping"),
    ({"mask": "chunked"}, "chunk", "is required for mask: chunked"),
    ({"mask": "chunked", "chunk": 0}, "chunk", "must be >= 1, got 0"),
    ({"chunk": 64}, "chunk", "only applies to chunked"),
    ({"mask": "sink_window", "window": 16}, "sink_tokens", "is required for mask: sink_window"),
    ({"mask": "gpt_oss_swa", "window": 64}, "window", "only applies to sliding-window masks (mask is 'gpt_oss_swa')"),
    ({"mask": "gpt_oss_swa", "sinks": "none"}, "sinks", "gpt_oss_swa has learned sinks"),
    ({"sinks": True}, "sinks", "must be learned or none"),
    ({"score_mod": "t5_bias", "num_buckets": 30}, "score_mod", "num_buckets must be a multiple of 4"),
    ({"score_mod": "t5_bias", "max_distance": 8}, "score_mod", "max_distance must be greater than"),
    ({"let": {"d": "q_idx"}}, "let", "only applies to {expr: ...}"),
    ({"score_mod": {"expr": "score + e"}, "let": {"e": "zz"}}, "let", "let 'e': 'zz': unknown name 'zz'"),
    ({"score_mod": {"expr": "score + q_idx"}, "let": {"h": "1"}}, "let", "let 'h' shadows a built-in name"),
    ({"score_mod": {"expr": "score + p[q_idx]"}, "params": {"p": {"shape": ["q"]}}}, "params",
     "'p': unknown axis 'q' (an axis is 'b' (batch), 'h' (query heads) or a positive integer)"),
    ({"score_mod": {"expr": "score + p[h]"}, "params": {"p": {"shape": ["h"], "dtype": "fp64"}}}, "params",
     "'p': dtype must be one of fp32, fp16, bf16, int32, got 'fp64'"),
    ({"score_mod": {"expr": "score + p[h]"}, "params": {"p": {"shape": ["h"], "grad": True}}}, "params",
     "'p': unknown key 'grad'"),
    ({"score_mod": {"expr": "score"}, "params": {"p": {"shape": ["h"]}}}, "params",
     "'p' is declared but used by no expression"),
    ({"score_mod": {"expr": "score + p[h]"}, "params": {"p": {"shape": []}}}, "score_mod",
     "parameter 'p' has 0 axes [], got 1 indices"),
    ({"mask": {"expr": "kv_idx < p[b]"}, "params": {"p": {"shape": ["b"], "learnable": True}}}, "params",
     "'p' is learnable but the mask uses it (a mask is not differentiable"),
    ({"score_mod": {"expr": "score + p[q_idx, kv_idx]"}, "params": {"p": {"shape": [64, 64], "learnable": True}}},
     "params", "'p[q_idx, kv_idx]': a learnable parameter's subscripts must each be b, h or one general"),
    ({"score_mod": {"expr": "score + p[h]"}, "params": {"p": {"shape": ["h"], "dtype": "int32", "learnable": True}}},
     "params", "a learnable parameter must be fp32, fp16 or bf16"),
    ({"score_mod": "alibi", "params": {"slope": {"shape": [8]}}}, "params",
     "'slope': alibi declares it with shape ['h'], got [8]"),
    ({"mask": "prefix_lm", "dtypes": ["fp8_e4m3"]}, "dtypes", "fp8_e4m3 kernels take no expressions or sinks"),
    ({"sinks": "learned", "dtypes": ["bf16", "fp8_e4m3"]}, "dtypes", "fp8_e4m3 kernels take no expressions"),
]


@pytest.mark.parametrize("changes, field, words", BAD_ROWS, ids=[f"{r[1]}-{i}" for i, r in enumerate(BAD_ROWS)])
def test_bad_field(tmp_path, changes, field, words):
    path, problems = problems_of(tmp_path, entry(name="bad", **changes))
    prefix = f"{path}: kernel 'bad' (entry 1): field '{field}': "
    assert any(p.startswith(prefix) and words in p for p in problems), problems


def test_every_problem_at_once(tmp_path):
    path, problems = problems_of(
        tmp_path,
        entry(name="a", mask={"expr": "kv_idx <= q_idxx"}, score_mod={"expr": "score + w[q_idx, kv_idx]"},
              params={"w": {"shape": ["q", 4], "learnable": True}}, sinks="maybe", chunk=16),
        entry(name="b", mask="sink_window", sink_tokens=4, window=0, dtypes=["bf16", "fp8_e4m3"]))
    at = lambda name, i, field: f"{path}: kernel '{name}' (entry {i}): field '{field}': "
    assert problems == [
        at("a", 1, "sinks") + "must be learned or none, got 'maybe'",
        at("a", 1, "params") + "'w': unknown axis 'q' (an axis is 'b' (batch), 'h' (query heads) or a positive integer)",
        at("a", 1, "chunk") + "only applies to chunked (not used by this entry)",
        at("a", 1, "mask") + "'q_idxx': unknown name 'q_idxx' (known: b, h, kv_idx, q_idx, seqlen_k, seqlen_q)",
        at("b", 2, "window") + "must be >= 1, got 0",
        at("b", 2, "dtypes") + "fp8_e4m3 kernels take no expressions or sinks (mask, score_mod, sinks); give "
                               "fp8_e4m3 an entry of its own with a built-in mask",
    ]


def test_build_writes_nothing_on_a_bad_expression(tmp_path):
    from attngen.cli import main

    spec = write_spec(tmp_path, {"kernels": [entry(mask={"expr": "kv_idx <= nope"})]})
    out = tmp_path / "out"
    assert main(["build", str(spec), "--out", str(out)]) == 2
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("text, want", [
    ("kv_idx <= q_idx", -1), ("kv_idx < q_idx + 1", -1), ("q_idx >= kv_idx", -1),
    ("(kv_idx <= q_idx) and ((q_idx - kv_idx) < 128)", 127), ("q_idx >= kv_idx and kv_idx > q_idx - 128", 127),
    ("kv_idx <= q_idx and kv_idx >= q_idx", 0), ("kv_idx <= q_idx and q_idx - kv_idx < 9 and q_idx - kv_idx < 5", 4),
    ("kv_idx <= q_idx + 1", None), ("kv_idx >= q_idx - 7", None), ("kv_idx <= q_idx or kv_idx < 3", None),
    ("kv_idx <= q_idx and q_idx // 8 == kv_idx // 8", None), ("kv_idx <= q_idx and b == 0", None),
    ("2 * kv_idx <= q_idx", None), ("kv_idx <= q_idx and q_idx - kv_idx < 0", None)])
def test_builtin_mask_recognized(text, want):
    # a mask expression that is a built-in mask (causal, a causal window) runs the built-in kernels
    from attngen.spec.expr_terms import builtin_mask

    assert builtin_mask(X.parse(text, "mask", {})) == want
