"""How far a mask expression lets a query reach back (key_reach), and the two choices made from
it: the forward's per-tile test of a parameter gathered along the keys (only where no short
window bounds the key range already) and the backward's dK/dV tiles of expression kernels."""
import dataclasses

import pytest

from attngen.codegen.exprranges import gathers_along, needs_tile_skip
from attngen.families.bwd import default_bwd_config
from attngen.spec import KernelSpec
from attngen.spec import expr as X
from attngen.spec.expr_terms import key_reach

DOC = {"doc": X.ParamDecl("doc", (8192,), "int32", False), "pl": X.ParamDecl("pl", ("b",), "int32", False)}


@pytest.mark.parametrize("text, reach", [
    ("kv_idx <= q_idx", None),
    ("kv_idx <= q_idx and q_idx - kv_idx < 512", 511),
    ("kv_idx >= q_idx - 100 and doc[q_idx] == doc[kv_idx]", 100),
    ("kv_idx > q_idx - 7", 6),
    ("q_idx - kv_idx <= 64 and q_idx - kv_idx < 32", 31),
    ("kv_idx <= q_idx and q_idx // 8192 == kv_idx // 8192", 8191),
    ("kv_idx // 64 == q_idx // 32", None),  # not the same chunks
    ("kv_idx <= q_idx or q_idx - kv_idx < 5", None),  # an `or` bounds nothing
    ("kv_idx - q_idx < 5", None),  # bounds keys ahead, not behind
])
def test_key_reach(text, reach):
    assert key_reach(X.parse(text, "mask", DOC)) == reach


def test_gathered_parameter_tile_test_only_without_a_short_window():
    parse = lambda t: X.parse(t, "mask", DOC)  # noqa: E731
    # doc[kv_idx] compared with something else than doc[q_idx] (a run pattern takes ranges instead)
    assert needs_tile_skip(parse("doc[q_idx] <= doc[kv_idx] and kv_idx <= q_idx"), "kv_idx")
    assert not needs_tile_skip(parse("doc[q_idx] <= doc[kv_idx] and q_idx - kv_idx < 512"), "kv_idx")
    assert needs_tile_skip(parse("doc[q_idx] <= doc[kv_idx] and q_idx - kv_idx < 4096"), "kv_idx")
    assert not needs_tile_skip(parse("kv_idx <= q_idx and kv_idx < pl[b]"), "kv_idx")  # b: one value a tile
    # the backward's loops: the dQ pass's over keys, the dK/dV pass's over queries
    assert gathers_along(parse("doc[q_idx] <= doc[kv_idx] and kv_idx <= q_idx"), "q_idx")
    assert gathers_along(parse("doc[q_idx] <= doc[kv_idx] and kv_idx <= q_idx"), "kv_idx")
    assert not gathers_along(parse("doc[q_idx] <= doc[kv_idx] and q_idx - kv_idx < 512"), "q_idx")
    assert not gathers_along(parse("kv_idx <= q_idx or kv_idx < 3"), "kv_idx")  # an `or`: the forward only


def _spec(text, d=128, params=(DOC["doc"],), sinks=False):
    return KernelSpec(family="bwd", dtype="bf16", target="sm90", head_dim_qk=d, head_dim_v=d, gqa_ratio=4,
                      mask="none", mask_expr=text, params=params, sinks=sinks)


def test_expression_backward_defaults():
    from attngen.families import bwd as bwd_mod

    short = default_bwd_config(_spec("doc[q_idx] == doc[kv_idx] and q_idx - kv_idx < 512 and kv_idx <= q_idx"))
    long = default_bwd_config(_spec("kv_idx <= q_idx and q_idx // 8192 == kv_idx // 8192", params=()))
    wide = default_bwd_config(_spec("kv_idx <= q_idx or kv_idx < pl[b]", d=256, params=(DOC["pl"],)))
    sinks = default_bwd_config(_spec("kv_idx <= q_idx and q_idx // 8192 == kv_idx // 8192", params=(), sinks=True))
    if bwd_mod.WS_EXPR_DEFAULT:
        # the Gluon passes, short reaches and long, the split roles past hd128, and the Triton dQ
        # pass where the sinks' gradient is summed
        assert (short.block_m, short.block_n, short.consumers, short.dq_consumers) == (64, 128, 2, 2)
        assert (long.block_m, long.block_n, long.consumers, long.dq_consumers) == (64, 128, 2, 2)
        assert (wide.block_n, wide.consumers, wide.roles, wide.dq_consumers) == (64, 2, True, 0)
        assert (sinks.consumers, sinks.dq_consumers) == (2, 0)
        # where the Gluon passes take no call (softcapping), a short reach gets the Triton
        # dK/dV pass's 32-query steps
        capped = default_bwd_config(dataclasses.replace(
            _spec("doc[q_idx] == doc[kv_idx] and q_idx - kv_idx < 512 and kv_idx <= q_idx"), softcap=True))
        assert (capped.block_m, capped.block_n, capped.tma, capped.consumers) == (32, 64, True, 0)
    else:
        assert (short.block_m, short.block_n, short.tma, short.consumers) == (32, 64, True, 0)
        assert (long.block_m, long.block_n, long.tma, long.consumers) == (64, 64, True, 0)
        assert (wide.block_m, wide.block_n, wide.split_dkdv) == (32, 128, True)
        assert sinks.consumers == 0


def test_gluon_expression_configs_are_valid():
    """Whatever the defaults, the Gluon passes take expression kernels where the tuner may pick
    them: both passes without parameter gradients, the dK/dV pass alone with sinks."""
    from attngen.configs import check_bwd
    from attngen.families.bwd import WS_BWD_DEFAULT

    plain = _spec("kv_idx <= q_idx and q_idx // 8192 == kv_idx // 8192", params=())
    sinks = _spec("kv_idx <= q_idx and q_idx // 8192 == kv_idx // 8192", params=(), sinks=True)
    assert check_bwd(plain, WS_BWD_DEFAULT) is None
    assert "dq_consumers" in check_bwd(sinks, WS_BWD_DEFAULT)
    assert check_bwd(sinks, dataclasses.replace(WS_BWD_DEFAULT, dq_consumers=0, dq_num_warps=8)) is None
    # packed documents with expressions too (tests/gpu/test_gpu_expr.py: the varlen test)
    assert check_bwd(dataclasses.replace(plain, varlen=True), WS_BWD_DEFAULT) is None


def test_explain_says_which_loops_test_tiles():
    import torch

    import attngen

    q, k = torch.randn(1, 4, 96, 32, dtype=torch.float16), torch.randn(1, 2, 96, 32, dtype=torch.float16)
    doc = (torch.arange(96) // 40).to(torch.int32)
    docs = attngen.explain(q, k, k, mask_mod=lambda b, h, qi, ki: (doc[qi] <= doc[ki]) & (ki <= qi))
    window = attngen.explain(q, k, k, mask_mod=lambda b, h, qi, ki: (doc[qi] == doc[ki]) & (qi - ki < 16))
    assert "backward's loops too (a parameter gathered along kv_idx and q_idx)" in docs["expressions"]["tile_classification"]
    assert "skips" not in window["expressions"]["tile_classification"]


def test_run_bounds():
    import torch

    from attngen.kernels.expr_buffers import RUN_END, run_bounds

    got = run_bounds(torch.tensor([0, 0, 1, 1, 1, 3], dtype=torch.int32)).tolist()
    assert got == [0, 0, 2, 2, 2, 5] + [2, 2, 5, 5, 5, RUN_END] + [1]
    # a value that comes back after another: the runs bound nothing, and the flag says so
    assert run_bounds(torch.tensor([0, 0, 1, 0], dtype=torch.int32)).tolist() == [0] * 4 + [RUN_END] * 4 + [0]
    assert run_bounds(torch.tensor([7], dtype=torch.int32)).tolist() == [0, RUN_END, 1]


def test_run_patterns_take_ranges_not_tile_tests():
    from attngen.spec.expr_terms import run_params

    parse = lambda t: X.parse(t, "mask", DOC)  # noqa: E731
    docs = parse("doc[q_idx] == doc[kv_idx] and kv_idx <= q_idx")
    assert run_params(docs) == ["doc"]
    assert not gathers_along(docs, "kv_idx") and not gathers_along(docs, "q_idx")
    other = parse("doc[q_idx] <= doc[kv_idx] and kv_idx <= q_idx")  # not an equality: tested per tile
    assert run_params(other) == [] and gathers_along(other, "kv_idx")


def test_tuner_makes_sorted_ids_and_their_runs():
    """The tuner's inputs for a run pattern: sorted ids (documents as in use) and XR_ from them."""
    import types

    import torch

    from attngen.families import expr_tuning
    from attngen.kernels.expr_buffers import run_bounds

    spec = _spec("doc[q_idx] == doc[kv_idx] and kv_idx <= q_idx")
    problem = types.SimpleNamespace(batch=1, heads_q=4, seqlen_k=8192, seqlen_q=8192)
    t = expr_tuning.inputs(types.SimpleNamespace(problem=problem, spec=spec, device="cpu"), seed=0)
    ids = t["XP_doc"]
    assert ids.dtype == torch.int32 and bool((ids[1:] >= ids[:-1]).all()) and int(ids.max()) > 0
    assert torch.equal(t["XR_doc"], run_bounds(ids)) and set(expr_tuning.extra(t)) == {"XP_doc", "XR_doc"}


class _Scalar:
    """The scalar calls of the range fragments, on Python ints (tl / gl alike)."""

    @staticmethod
    def where(c, a, b):
        return a if c else b

    maximum = staticmethod(max)
    minimum = staticmethod(min)

    @staticmethod
    def cdiv(a, b):
        return -(-a // b)


@pytest.mark.parametrize("text", ["(kv_idx <= q_idx) and ((kv_idx < 4) or (q_idx - kv_idx < 24))",
                                  "(kv_idx <= q_idx) and (q_idx // 32 == kv_idx // 32)",
                                  "q_idx - kv_idx < 40 and kv_idx - q_idx < 9"])
def test_query_ranges_hold_every_kept_pair(text):
    """The dK/dV pass's query range of a key block, given as code that is not one name (the
    Gluon consumer's "kc + CN - 1"), evaluated on ints: every query row that keeps a key of the
    block lies in [lo, hi), and every row in [full_lo, full_hi) keeps them all (the negated bound
    was once written bare: -kc + CN - 1)."""
    from attngen.codegen import exprgen as xg

    spec = KernelSpec(family="bwd", dtype="bf16", target="sm90", head_dim_qk=64, head_dim_v=64, gqa_ratio=1,
                      mask="none", mask_expr=text)
    code = xg.gluon(xg.query_range(spec, "kc", "kc + CN - 1"))
    keep = eval("lambda q_idx, kv_idx: " + text)  # noqa: S307 -- the test's own literal
    sq, sk, cn, bm = 203, 1023, 64, 32
    diag = sk - sq
    for kc in range(0, sk, cn):
        env = {"gl": _Scalar, "kc": kc, "CN": cn, "BLOCK_M": bm, "seqlen_q": sq, "diag_offset": diag,
               "x_h_lo": 0, "x_h_hi": 0, "x_b": 0}
        exec(code, env)  # noqa: S102
        keys = range(kc, min(kc + cn, sk))
        for r in range(sq):
            kept = [keep(r + diag, k) for k in keys]
            if any(kept):
                assert env["lo"] <= r < env["hi"], (text, kc, r, env["lo"], env["hi"])
            if env["full_lo"] <= r < env["full_hi"]:
                assert all(kept) and len(kept) == cn, (text, kc, r)
