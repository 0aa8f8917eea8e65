"""attngen.runtime.trace: FlexAttention-style callables -> expression text + captured tensors.

Each case is checked two ways: the exact text (where it is short enough to read), and its meaning --
the text evaluated by a small interpreter of the grammar (below, walking ast with torch ops on
broadcast index tensors) against the user's callable run on the same tensors."""

from __future__ import annotations

import ast
import functools
import math
import operator
import subprocess
import sys

import pytest
import torch

from attngen.runtime.trace import (TraceError, Traced, seqlen_k, seqlen_q, trace_mask_mod,
                                   trace_score_mod, traced_key)

B, H, Q, K = 2, 4, 264, 264  # past two 128-chunks and T5's max distance
_gen = torch.Generator().manual_seed(0)
BIAS = torch.randn(H, 32, dtype=torch.float64, generator=_gen)
SLOPES = torch.rand(H, dtype=torch.float64, generator=_gen)
T5_BIAS = torch.randn(H, 32, dtype=torch.float64, generator=_gen)
PREFIX = torch.tensor([37, 150], dtype=torch.int32)
DOC = torch.cumsum(torch.rand(B, Q, generator=_gen) < 0.02, dim=1).to(torch.int32)  # doc id per token
SCALE = torch.tensor(0.125, dtype=torch.float64)
SHIFT = torch.tensor(3)  # 0-d int64
ALLOWED = torch.rand(H, K, generator=_gen) < 0.7  # a bool table


# ------------------------------------------------------------------------------------ the callables

def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def chunked_causal(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) & (q_idx // 128 == kv_idx // 128)


def sliding_sink(b, h, q, k):
    return torch.where(k < 4, True, (q - k < 128) & (k <= q))


def prefix_lm(b, h, q_idx, kv_idx):
    return (kv_idx <= q_idx) | (kv_idx < PREFIX[b])


def document(b, h, q_idx, kv_idx):
    return (DOC[b, q_idx] == DOC[b, kv_idx]) & ~(kv_idx > q_idx)


def logic_mix(b, h, q, k):
    return torch.logical_or((q % 7 == 3) ^ (k % 5 != 1), torch.logical_not(h == 2)) & (b != 1)


def logic_of_ints(b, h, q, k):  # logical_* and .bool() compare numbers with 0, as torch does
    return torch.logical_and(q % 3, torch.logical_not(k % 4)) | (q - k).bool().logical_not()


def bool_table(b, h, q_idx, kv_idx):
    return ALLOWED[h, kv_idx] & (q_idx >= kv_idx)


def rel_bias(score, b, h, q_idx, kv_idx):
    return score + BIAS[h, torch.clamp(kv_idx - q_idx + 16, 0, 31)]


def alibi(score, b, h, q_idx, kv_idx):
    return score - SLOPES[h] * (q_idx - kv_idx).abs()


def softcap(score, b, h, q, k):
    return 30.0 * torch.tanh(score / 30.0)


def scaled(score, b, h, q, k):
    return SCALE * score + (q - k) % SHIFT - 1e-06


def t5_bucket(score, b, h, q_idx, kv_idx):
    """T5's bidirectional relative-position buckets (32 buckets, max distance 128)."""
    rel = kv_idx - q_idx
    buckets = (rel > 0).long() * 16
    rel = torch.abs(rel)
    is_small = rel < 8
    large = 8 + (torch.log(rel.float() / 8) / math.log(128 / 8) * (16 - 8)).to(torch.long)
    large = torch.min(large, torch.full_like(large, 15))
    return score + T5_BIAS[h, buckets + torch.where(is_small, rel, large)]


def numeric_mix(score, b, h, q, k):
    d = (q - k).float()
    x = torch.sqrt(torch.abs(d) + 1.0) * score.exp().clamp_max(5.0) - torch.floor(score) % 3
    return x + (-d) ** 2 / 1000 + score.where(q > k, -score) + torch.maximum(score, torch.zeros_like(score))


def truncating(score, b, h, q, k):  # .long() truncates toward zero, negative scores included
    return (score * 10).long() + torch.ceil(score) * 2 + torch.trunc(score * 3)


def int_valued(score, b, h, q, k):
    return (q > k).float() * 2 + h.to("cpu", torch.float64)


def rounding_and_clamps(s, b, h, q, k):
    d = q - k
    return (torch.div(d, 7, rounding_mode="floor") + torch.div(d, 7, rounding_mode="trunc") + (-d) % 5
            + torch.ceil(s) + torch.clamp(s, min=-1.0) + s.clamp_min(0.5) + torch.maximum(s, SCALE)
            - torch.minimum(q, k))


def powers_and_calls(s, b, h, q, k):
    return ((s * 2) ** 2 + (q - k) ** 2 + torch.sqrt(torch.abs(s)) + torch.exp(-torch.abs(s))
            + torch.log(q + 1.0) + torch.abs(s) ** 0.5)


def where_mixed(s, b, h, q, k):
    return (torch.where(q > k, 1.5, q) - s + torch.where(q > k, s, torch.full_like(s, 2.0)) * torch.tensor(3)
            + torch.tensor(2.0))


CASES = [  # (callable, expected text or None)
    (causal, "(q_idx >= kv_idx)"),
    (chunked_causal, "((q_idx >= kv_idx) and ((q_idx // 128) == (kv_idx // 128)))"),
    (sliding_sink, "(True if (kv_idx < 4) else (((q_idx - kv_idx) < 128) and (kv_idx <= q_idx)))"),
    (prefix_lm, "((kv_idx <= q_idx) or (kv_idx < p0[b]))"),
    (document, "((p0[b, q_idx] == p0[b, kv_idx]) and (not (kv_idx > q_idx)))"),
    (logic_mix, None),
    (logic_of_ints, "((((q_idx % 3) != 0) and (not ((kv_idx % 4) != 0))) or (not ((q_idx - kv_idx) != 0)))"),
    (bool_table, "((p0[h, kv_idx] != 0) and (q_idx >= kv_idx))"),
    (rel_bias, "(score + p0[h, min(max(((kv_idx - q_idx) + 16), 0), 31)])"),
    (alibi, "(score - (p0[h] * abs((q_idx - kv_idx))))"),
    (softcap, "(30.0 * tanh((score / 30.0)))"),
    (scaled, "(((p0 * score) + ((q_idx - kv_idx) % p1)) - 1e-06)"),
    (t5_bucket, None),
    (numeric_mix, None),
    (truncating, None),
    (int_valued, "(((1 if (q_idx > kv_idx) else 0) * 2) + h)"),
    (rounding_and_clamps, None),
    (powers_and_calls, None),
    (where_mixed, "((((1.5 if (q_idx > kv_idx) else q_idx) - score) + ((score if (q_idx > kv_idx) else 2.0) "
                  "* p0)) + p1)"),
]
MASKS = {causal, chunked_causal, sliding_sink, prefix_lm, document, logic_mix, logic_of_ints, bool_table}


def trace(fn) -> Traced:
    return trace_mask_mod(fn) if fn in MASKS else trace_score_mod(fn)


# ----------------------------------------------------------------------- an evaluator of the grammar

def _t(x):
    return torch.as_tensor(x)


_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
_CMP = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
        ast.Eq: operator.eq, ast.NotEq: operator.ne}
_CALL = {"abs": lambda x: torch.abs(_t(x)), "min": lambda a, b: torch.minimum(_t(a), _t(b)),
         "max": lambda a, b: torch.maximum(_t(a), _t(b)), "exp": lambda x: torch.exp(_t(x)),
         "log": lambda x: torch.log(_t(x)), "tanh": lambda x: torch.tanh(_t(x)),
         "sqrt": lambda x: torch.sqrt(_t(x)),
         "floor": lambda x: torch.floor(_t(x)).long() if _t(x).is_floating_point() else _t(x)}


def evaluate(t: Traced, env: dict):
    """The meaning of t.expr: Python semantics on broadcast tensors (floor of a float is an int)."""
    params = dict(t.params)

    def ev(n):
        if isinstance(n, ast.Constant):
            return n.value
        if isinstance(n, ast.Name):
            return env[n.id] if n.id in env else params[n.id]
        if isinstance(n, ast.BinOp):
            return _BIN[type(n.op)](ev(n.left), ev(n.right))
        if isinstance(n, ast.UnaryOp):
            x = ev(n.operand)
            return -x if isinstance(n.op, ast.USub) else torch.logical_not(_t(x))
        if isinstance(n, ast.Compare):
            assert len(n.ops) == 1, f"chained comparison in {t.expr}"
            return _CMP[type(n.ops[0])](ev(n.left), ev(n.comparators[0]))
        if isinstance(n, ast.BoolOp):
            assert len(n.values) == 2, f"{t.expr}: and/or of more than two"
            f = torch.logical_and if isinstance(n.op, ast.And) else torch.logical_or
            return f(_t(ev(n.values[0])), _t(ev(n.values[1])))
        if isinstance(n, ast.IfExp):
            return torch.where(_t(ev(n.test)), ev(n.body), ev(n.orelse))
        if isinstance(n, ast.Call):
            return _CALL[n.func.id](*(ev(a) for a in n.args))
        if isinstance(n, ast.Subscript):
            subs = n.slice.elts if isinstance(n.slice, ast.Tuple) else [n.slice]
            return params[n.value.id][tuple(ev(s) for s in subs)]
        raise AssertionError(f"{ast.dump(n)} is outside the grammar ({t.expr})")

    return ev(ast.parse(t.expr, mode="eval").body)


@functools.lru_cache(maxsize=1)
def grid(seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"b": torch.arange(B).view(B, 1, 1, 1), "h": torch.arange(H).view(1, H, 1, 1),
            "q_idx": torch.arange(Q).view(1, 1, Q, 1), "kv_idx": torch.arange(K).view(1, 1, 1, K),
            "score": torch.randn(B, H, Q, K, dtype=torch.float64, generator=g) * 3}


def assert_same(name: str, got, want, atol: float = 1e-12) -> None:
    """Bool and int results match exactly, floats to atol; the worst mismatches are named."""
    got, want = _t(got).broadcast_to((B, H, Q, K)), _t(want).broadcast_to((B, H, Q, K))
    assert (got.dtype == torch.bool) == (want.dtype == torch.bool), f"{name}: {got.dtype} vs {want.dtype}"
    if got.dtype == want.dtype and torch.equal(got, want):
        return
    assert torch.equal(got.isnan(), want.isnan()), f"{name}: NaNs differ"
    assert torch.equal(got.isinf(), want.isinf()), f"{name}: infs differ"
    fin = got.isfinite() & want.isfinite()
    err = torch.zeros(got.shape, dtype=torch.float64)
    err[fin] = (got[fin].double() - want[fin].double()).abs()
    if got.dtype == torch.bool or not got.is_floating_point():
        atol = 0.0
    bad = err > atol
    if bad.any():
        worst = err.flatten().topk(min(3, int(bad.sum()))).indices
        rows = [f"at {tuple(torch.unravel_index(i, err.shape))}: got {got.flatten()[i].item()}, "
                f"want {want.flatten()[i].item()}" for i in worst]
        raise AssertionError(f"{name}: {int(bad.sum())} mismatches (atol {atol}); " + "; ".join(rows))


# -------------------------------------------------------------------------------------------- tests

@pytest.mark.parametrize("fn, text", CASES, ids=[c[0].__name__ for c in CASES])
def test_text_and_meaning(fn, text):
    t = trace(fn)
    if text is not None:
        assert t.expr == text
    ast.parse(t.expr, mode="eval")
    env = grid()
    want = fn(env["b"], env["h"], env["q_idx"], env["kv_idx"]) if fn in MASKS else \
        fn(env["score"], env["b"], env["h"], env["q_idx"], env["kv_idx"])
    assert_same(fn.__name__, evaluate(t, env), want)


@pytest.mark.parametrize("fn", [c[0] for c in CASES], ids=[c[0].__name__ for c in CASES])
def test_the_spec_parser_accepts_the_text(fn):
    """The contract with attngen.spec.expr: every traced text parses there, with the right kind
    (parameters declared as the runtime would: floats fp32, integers and booleans int32)."""
    from attngen.spec import expr as X

    t = trace(fn)
    decls = {n: X.ParamDecl(n, tuple(p.shape), "fp32" if p.is_floating_point() else "int32")
             for n, p in t.params}
    X.parse(t.expr, "mask" if fn in MASKS else "score", decls)


def test_the_check_catches_a_wrong_translation():
    """The evaluator and assert_same are the oracle: a text one operator off must fail them."""
    env = grid()
    for fn, right, wrong in ((chunked_causal, ">=", ">"), (truncating, "(-floor((-", "(floor((")):
        t = trace(fn)
        assert right in t.expr
        broken = Traced(t.expr.replace(right, wrong, 1), t.params)
        want = fn(env["b"], env["h"], env["q_idx"], env["kv_idx"]) if fn in MASKS else \
            fn(env["score"], env["b"], env["h"], env["q_idx"], env["kv_idx"])
        with pytest.raises(AssertionError, match="mismatches"):
            assert_same(fn.__name__, evaluate(broken, env), want)


def test_t5_text_truncates_the_log_bucket():
    expr = trace(t5_bucket).expr
    assert "log(" in expr and "floor(" in expr and "(1 if ((kv_idx - q_idx) > 0) else 0)" in expr
    assert expr.startswith("(score + p0[h, ")
    assert repr(math.log(16)) in expr


def test_params_are_named_in_text_order_and_deduplicated():
    a, c = torch.randn(H), torch.randn(H)
    t = trace_score_mod(lambda score, b, h, q, k: c[h] * score + a[h] - c[(h + 1) % H] + a[0])
    # a[0] has no traced subscript: Python evaluates it, a 0-d view, a parameter of its own
    assert t.expr == "((((p0[h] * score) + p1[h]) - p0[((h + 1) % 4)]) + p2)"
    assert [n for n, _ in t.params] == ["p0", "p1", "p2"]
    assert t.params[0][1] is c and t.params[1][1] is a and t.params[2][1].data_ptr() == a.data_ptr()
    twin = a.clone()  # equal values, another tensor: another parameter
    assert [n for n, _ in trace_score_mod(lambda s, b, h, q, k: s + a[h] + twin[h]).params] == ["p0", "p1"]


def test_params_in_a_where_are_named_as_the_text_reads():
    x, y = torch.randn(H), torch.randn(H)
    t = trace_score_mod(lambda s, b, h, q, k: torch.where(x[h] > 0, s + y[h], s))
    assert t.expr == "((score + p0[h]) if (p1[h] > 0) else score)"
    assert t.params[0][1] is y and t.params[1][1] is x


def test_an_exploding_expression_is_refused():
    def doubling(b, h, q, k):
        for _ in range(20):
            q = q + q
        return q > k

    with pytest.raises(TraceError, match="grows past"):
        trace_mask_mod(doubling)


def test_literal_subscripts_and_folding():
    t = trace_score_mod(lambda s, b, h, q, k: s + BIAS[h, -1] + BIAS[h - h, torch.full_like(q, 7) // -2 + 4])
    assert t.expr == "((score + p0[h, 31]) + p0[(h - h), 0])"
    assert trace_mask_mod(lambda b, h, q, k: True).expr == "True"
    assert trace_score_mod(lambda s, b, h, q, k: 2.5).expr == "2.5"


def test_seqlen_proxies():
    t = trace_mask_mod(lambda b, h, q, k: q + (seqlen_k - seqlen_q) >= k)
    assert t.expr == "((q_idx + (seqlen_k - seqlen_q)) >= kv_idx)"


def test_deterministic():
    def build():  # fresh tensors each time: identities differ, text must not
        bias = torch.randn(H, 32)
        return lambda s, b, h, q, k: s + bias[h, torch.clamp(k - q + 16, 0, 31)] * SCALE

    t1, t2 = trace_score_mod(build()), trace_score_mod(build())
    assert t1.expr == t2.expr
    assert traced_key(t1) == traced_key(t2) and hash(traced_key(t1)) == hash(traced_key(t2))
    assert traced_key(t1) == ("(score + (p0[h, min(max(((kv_idx - q_idx) + 16), 0), 31)] * p1))",
                              (("p0", torch.float32, (H, 32)), ("p1", torch.float64, ())))
    for fn, _ in CASES:
        assert trace(fn).expr == trace(fn).expr


def test_key_follows_dtype_and_shape():
    def key(t):
        return traced_key(trace_score_mod(lambda s, b, h, q, k: s + t[h]))

    assert key(torch.zeros(4)) == key(torch.ones(4))
    assert key(torch.zeros(4)) != key(torch.zeros(4, dtype=torch.float16))
    assert key(torch.zeros(4)) != key(torch.zeros(8))


def _python_if(b, h, q, k):
    if q > k:
        return True
    return False


ERRORS = [  # (kind, callable, substrings of the message)
    ("mask", lambda b, h, q, k: torch.sin(q) > 0, ["mask_mod '<lambda>'", "torch.sin is not supported",
                                                   "supported: "]),
    ("score", lambda s, b, h, q, k: s.sin(), ["Tensor.sin is not supported"]),
    ("mask", _python_if, ["mask_mod '_python_if' (test_trace.py:", "control flow", "torch.where"]),
    ("mask", lambda b, h, q, k: min(q, k) > 0, ["control flow"]),
    ("score", lambda s, b, h, q, k: s + BIAS[h], ["shape (4, 32)", "1 subscript", "give exactly 2"]),
    ("score", lambda s, b, h, q, k: s + BIAS[h][k], ["1 subscript", "t[h, i], not t[h][i]"]),
    ("score", lambda s, b, h, q, k: s + BIAS[:, h], ["slicing"]),
    ("score", lambda s, b, h, q, k: s * SLOPES, ["shape (4,) is used as a value", "index it"]),
    ("score", lambda s, b, h, q, k: s * torch.ones(1), ["shape (1,)", "make it 0-d or index it"]),
    ("score", lambda s, b, h, q, k: s + BIAS[h, s], ["subscript 1", "float-valued"]),
    ("score", lambda s, b, h, q, k: s + BIAS[h, 40], ["out of range"]),
    ("mask", lambda b, h, q, k: q / 2.0, ["returns a float", "a mask_mod returns a boolean"]),
    ("score", lambda s, b, h, q, k: q > k, ["returns a boolean"]),
    ("mask", lambda b, h, q, k: (q & 1) == 0, ["'&' of an int and an int", "bitwise"]),
    ("mask", lambda b, h, q, k: ~q == 0, ["'~' of an int", "bitwise"]),
    ("score", lambda s, b, h, q, k: torch.where(q >= k, s, -float("inf")), ["-inf", "mask_mod"]),
    ("score", lambda s, b, h, q, k: s ** 3, ["'**'"]),
    ("score", lambda s, b, h, q, k: math.log(s), ["int()/float()"]),
    ("score", lambda s, b, h, q, k: torch.min(s), ["reduces"]),
    ("score", lambda s, b, h, q, k: torch.where(q, s, 0.0), ["boolean condition"]),
    ("score", lambda s, b, h, q, k: s + (q >= k) + (q > k) * (k > q), ["two booleans"]),
    ("score", lambda s, b, h, q, k: torch.nn.functional.gelu(s), ["gelu is not supported"]),
    ("score", lambda s, b, h, q, k: torch.add(s, q, alpha=2), ["torch.add with these arguments"]),
    ("score", lambda s, b, h, q, k: [1, 2][h], ["Python index"]),
    ("mask", lambda b, h, q, k: None, ["returns None"]),
]


@pytest.mark.parametrize("kind, fn, needles", ERRORS,
                         ids=[f"{i}-{e[2][0][:24]}" for i, e in enumerate(ERRORS)])
def test_errors_name_the_operation(kind, fn, needles):
    with pytest.raises(TraceError) as info:
        (trace_mask_mod if kind == "mask" else trace_score_mod)(fn)
    for needle in needles:
        assert needle in str(info.value), f"{needle!r} not in {str(info.value)!r}"


def test_proxy_is_readable_and_unhashable():
    seen = []

    def spy(s, b, h, q, k):
        seen.append(repr(q - k))
        seen.append(str((q - k).dtype))
        with pytest.raises(TypeError):
            hash(q)
        return s

    assert trace_score_mod(spy).expr == "score"
    assert seen == ["<traced int: (q_idx - kv_idx)>", "torch.int64"]


def test_imports_neither_jinja2_nor_optuna():
    code = ("import sys, attngen.runtime.trace; "
            "print(sorted(m for m in ('jinja2', 'optuna', 'sqlalchemy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
