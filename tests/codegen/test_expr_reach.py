"""How far a mask expression lets a query reach back (key_reach), and the two choices made from
it: the forward's per-tile test of a parameter gathered along the keys (only where no short
window bounds the key range already) and the backward's dK/dV tiles of expression kernels."""
import pytest

from attngen.codegen.exprcode import gathers_along, needs_tile_skip
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
    assert needs_tile_skip(parse("doc[q_idx] == doc[kv_idx] and kv_idx <= q_idx"), "kv_idx")
    assert not needs_tile_skip(parse("doc[q_idx] == doc[kv_idx] and q_idx - kv_idx < 512"), "kv_idx")
    assert needs_tile_skip(parse("doc[q_idx] == doc[kv_idx] and q_idx - kv_idx < 4096"), "kv_idx")
    assert not needs_tile_skip(parse("kv_idx <= q_idx and kv_idx < pl[b]"), "kv_idx")  # b: one value a tile
    # the backward's loops: the dQ pass's over keys, the dK/dV pass's over queries
    assert gathers_along(parse("doc[q_idx] == doc[kv_idx] and kv_idx <= q_idx"), "q_idx")
    assert gathers_along(parse("doc[q_idx] == doc[kv_idx] and kv_idx <= q_idx"), "kv_idx")
    assert not gathers_along(parse("doc[q_idx] == doc[kv_idx] and q_idx - kv_idx < 512"), "q_idx")
    assert not gathers_along(parse("kv_idx <= q_idx or kv_idx < 3"), "kv_idx")  # an `or`: the forward only


def _spec(text, d=128, params=(DOC["doc"],)):
    return KernelSpec(family="bwd", dtype="bf16", target="sm90", head_dim_qk=d, head_dim_v=d, gqa_ratio=4,
                      mask="none", mask_expr=text, params=params)


def test_expression_backward_defaults():
    short = default_bwd_config(_spec("doc[q_idx] == doc[kv_idx] and q_idx - kv_idx < 512 and kv_idx <= q_idx"))
    long = default_bwd_config(_spec("kv_idx <= q_idx and q_idx // 8192 == kv_idx // 8192", params=()))
    wide = default_bwd_config(_spec("kv_idx <= q_idx or kv_idx < pl[b]", d=256, params=(DOC["pl"],)))
    assert (short.block_m, short.block_n, short.tma) == (32, 64, True)
    assert (long.block_m, long.block_n, long.tma) == (64, 64, True)
    assert (wide.block_m, wide.block_n, wide.split_dkdv) == (32, 128, True)
