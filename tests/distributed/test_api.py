"""attngen.distributed without processes: argument errors name the argument, expressions are
rewritten onto global positions, and the torch functions it runs on are the ones it was written
for."""

from __future__ import annotations

import inspect

import pytest
import torch

import attngen.distributed as agd
from attngen.distributed import ring
from attngen.distributed.expr import global_exprs
from attngen.distributed.public import ring_of


def qkv(s=26, sk=None, dtype=torch.bfloat16):
    q = torch.randn(1, 4, s, 16, dtype=dtype)
    k = torch.randn(1, 2, sk or s, 16, dtype=dtype)
    return q, k, k.clone()


@pytest.mark.parametrize("kw,arg,text", [
    (dict(load_balance="ring"), "load_balance", "'zigzag' or None"),
    (dict(rotate="p2p"), "rotate", "'allgather' or 'alltoall'"),
    (dict(window_size=(3,)), "window_size", r"expected \(left, right\)"),
    (dict(cu_seqlens=[0, 10, 50]), "cu_seqlens", "end at the global sequence length 52"),
    (dict(cu_seqlens=[1, 52]), "cu_seqlens", "start at 0"),
    (dict(cu_seqlens=[0, 30, 20, 52]), "cu_seqlens", "non-decreasing"),
    (dict(cu_seqlens=[0, 52], mask_mod="kv_idx <= q_idx"), "cu_seqlens", "not supported"),
    (dict(params={"w": torch.ones(2)}), "params", "without mask_mod"),
    (dict(mask_mod="kv_idx <= cp_q0", params={"cp_q0": torch.ones((), dtype=torch.int32)}), "params",
     "a name attngen.distributed uses"),
    (dict(score_mod="score * w[h]", params={"w": torch.ones(4, requires_grad=True)}), "params", "requires grad"),
    (dict(mask_mod=3), "mask_mod", "expected a callable"),
])
def test_argument_errors_name_the_argument(kw, arg, text):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=f"^{arg}: .*{text}"):
        ring_of(q, k, v, world=2, rank=0, **kw)


def test_shape_errors():
    q, k, v = qkv(26, 30)
    with pytest.raises(ValueError, match="^k: context parallelism shards one sequence"):
        ring_of(q, k, v, world=2, rank=0)
    q, k, v = qkv(25)
    with pytest.raises(ValueError, match="^q: the local sequence length 25 must be a multiple of 2"):
        ring_of(q, k, v, world=2, rank=0)
    ring_of(q, k, v, world=2, rank=0, load_balance=None)  # one chunk a rank: any length
    with pytest.raises(ValueError, match="^q: unsupported dtype"):
        ring_of(*(x.float() for x in qkv()), world=2, rank=0)


def test_without_a_process_group_the_error_says_so():
    q, k, v = qkv()
    with pytest.raises(RuntimeError, match="^group: torch.distributed is not initialized"):
        agd.attention(q, k, v)


def test_documents_are_global_boundaries():
    q, k, v = qkv()
    r = ring_of(q, k, v, world=2, rank=1, causal=True, cu_seqlens=torch.tensor([0, 7, 7, 40, 52], dtype=torch.int32))
    assert r.mask.docs == (0, 7, 40, 52) and r.mask.causal and r.seqlen == 52


def test_expressions_see_global_positions():
    bias = torch.randn(4, 8)
    mask, score, params, used = global_exprs(lambda b, h, q, kv: (kv <= q) & (q - kv < 9),
                                             "score + bias[h, min(q_idx - kv_idx, 7)] + seqlen_k * 0.0",
                                             {"bias": bias})
    assert mask == "kv_idx + cp_k0 <= q_idx + cp_q0 and q_idx + cp_q0 - (kv_idx + cp_k0) < 9"
    assert score == "score + bias[h, min(q_idx + cp_q0 - (kv_idx + cp_k0), 7)] + cp_seqlen * 0.0"
    assert used == {"cp_q0", "cp_k0", "cp_seqlen"} and params["bias"] is bias
    _, _, params, _ = global_exprs(lambda b, h, q, kv: kv < bias[h, 0].int(), None, None)
    assert list(params) == ["cpm_p0"]


def test_the_torch_ring_it_runs_on():
    """torch's _templated_ring_attention / _backward take an op, as in torch 2.11 and 2.13; a torch
    whose functions changed is a clear error, not a wrong result."""
    cp = ring.engine()
    for name, params in ring._NEED.items():
        assert tuple(inspect.signature(getattr(cp, name)).parameters)[:len(params)] == params
    saved = cp._templated_ring_attention
    try:
        ring._ENGINE = None
        cp._templated_ring_attention = lambda group, op, query, key, value: None
        with pytest.raises(RuntimeError, match="_templated_ring_attention is not the one it was written for"):
            ring.engine()
    finally:
        cp._templated_ring_attention = saved
        ring._ENGINE = None
    assert ring.engine() is cp


def test_torch_options_are_restored():
    cp = ring.engine()
    before = (cp._cp_options.enable_load_balance, cp._cp_options.rotate_method)
    with ring._torch_options(cp, "alltoall"):
        assert cp._cp_options.enable_load_balance is False
        assert cp._cp_options.rotate_method == cp._RotateMethod.ALL_TO_ALL
    assert (cp._cp_options.enable_load_balance, cp._cp_options.rotate_method) == before


def test_a_torch_that_skips_a_step_is_caught():
    q, k, v = qkv()
    r = ring_of(q, k, v, world=3, rank=0, causal=True)
    r._check_steps([0, 1, 2], "x")
    with pytest.raises(RuntimeError, match="called the attention op 2 times for 3 ranks"):
        r._check_steps([0, 1], "x")
