"""The ring's step plans (attngen.distributed.plan) and the sequence layout, on the host only: every
rank's calls over all steps cover exactly the pairs the global mask keeps, each once."""

from __future__ import annotations

import itertools

import pytest
import torch

from attngen.distributed import layout
from attngen.distributed.plan import Mask, step_calls
from attngen.problem import keep_mask


def doc_mask(n: int, bounds) -> torch.Tensor:
    ids = torch.zeros(n, dtype=torch.long)
    for b in bounds[1:-1]:
        ids[b:] += 1
    return ids[:, None] == ids[None, :]


def global_mask(seqlen: int, mask: Mask) -> torch.Tensor:
    keep = keep_mask(seqlen, seqlen, mask.causal, mask.window, top_left=True)
    return keep & doc_mask(seqlen, mask.docs) if mask.docs is not None else keep


def covered(calls, n: int) -> torch.Tensor:
    count = torch.zeros(n, n, dtype=torch.long)
    for c in calls:
        rows, cols = c.rows[1] - c.rows[0], c.cols[1] - c.cols[0]
        keep = keep_mask(rows, cols, c.causal, c.window, top_left=True)
        if c.cu is not None:
            assert c.rows == c.cols, c
            keep &= doc_mask(rows, c.cu)
        count[c.rows[0]:c.rows[1], c.cols[0]:c.cols[1]] += keep.long()
    return count


MASKS = [Mask(), Mask(causal=True), Mask(causal=True, window=(9, 0)), Mask(window=(5, 3)), Mask(window=(-1, 4)),
         Mask(window=(0, 0)), Mask(causal=True, window=(40, 0)), Mask(window=(2, -1)),
         Mask(causal=True, exact_offsets=True), Mask(causal=True, window=(7, 0), exact_offsets=True)]


@pytest.mark.parametrize("world,load_balance", [(2, "zigzag"), (3, "zigzag"), (4, "zigzag"), (3, None), (4, None)])
def test_steps_cover_the_global_mask_once(world, load_balance):
    c = 7
    seqlen = c * world * layout.chunks_per_rank(load_balance)
    docs_sets = [(0, 5, 6, 20, seqlen), (0, seqlen - 3, seqlen), (0, c, 2 * c + 1, seqlen)]
    masks = MASKS + [Mask(causal=cz, window=w, docs=d) for d in docs_sets for cz, w in
                     [(True, (-1, -1)), (False, (-1, -1)), (True, (4, 0)), (False, (3, 2))]]
    for mask in masks:
        full = global_mask(seqlen, mask)
        for rank in range(world):
            pos_q = layout.positions(seqlen, rank, world, load_balance)
            for step in range(world):
                src = (rank - step) % world
                pos_k = layout.positions(seqlen, src, world, load_balance)
                want = full[pos_q][:, pos_k].long()
                calls = step_calls(seqlen, world, rank, step, load_balance, mask)
                got = covered(calls, len(pos_q))
                assert torch.equal(got, want), f"{mask} rank {rank} step {step}: {calls}"
                for call in calls:  # no row or key of a call sees nothing (trimmed)
                    part = covered([call], len(pos_q))[call.rows[0]:call.rows[1], call.cols[0]:call.cols[1]]
                    assert bool(part.any(1).all()) and bool(part.any(0).all()), call
                    if mask.exact_offsets:  # one affine map to global positions per call
                        assert call.origin == (int(pos_q[call.rows[0]]), int(pos_k[call.cols[0]])), call
                        assert torch.equal(pos_q[call.rows[0]:call.rows[1]] - call.origin[0],
                                           torch.arange(call.rows[1] - call.rows[0])), call


def test_zigzag_causal_is_one_call_per_step():
    """PyTorch's load-balanced causal schedule: the first step one causal call over both local
    chunks, later ones a full call over half of the queries or half of the keys."""
    world, c = 4, 5
    for rank, step in itertools.product(range(world), range(world)):
        calls = step_calls(2 * world * c, world, rank, step, "zigzag", Mask(causal=True))
        assert len(calls) == 1, calls
        call = calls[0]
        src = (rank - step) % world
        if step == 0:
            assert (call.rows, call.cols, call.causal) == ((0, 2 * c), (0, 2 * c), True)
        elif src < rank:
            assert (call.rows, call.cols, call.causal, call.window) == ((0, 2 * c), (0, c), False, (-1, -1))
        else:
            assert (call.rows, call.cols, call.causal, call.window) == ((c, 2 * c), (0, 2 * c), False, (-1, -1))


def test_a_window_skips_the_steps_it_never_reaches():
    calls = [step_calls(64, 4, 3, s, None, Mask(causal=True, window=(3, 0))) for s in range(4)]
    assert [len(c) for c in calls] == [1, 1, 0, 0]


def test_zigzag_layout_is_torchs_head_tail_layout():
    from torch.distributed.tensor.experimental._context_parallel._load_balancer import _HeadTailLoadBalancer

    for world in (1, 2, 3, 4, 8):
        seqlen = 6 * world
        ours = torch.cat([layout.positions(seqlen, r, world) for r in range(world)])
        theirs = _HeadTailLoadBalancer(seqlen, world, "cpu")._generate_indices()[0]
        assert torch.equal(ours, theirs.long()), world


def test_shard_and_assemble_round_trip():
    x = torch.randn(2, 3, 24, 4)
    for world, lb in [(2, "zigzag"), (3, "zigzag"), (4, None), (1, "zigzag")]:
        shards = [layout.shard(x, r, world, load_balance=lb) for r in range(world)]
        for r, s in enumerate(shards):
            assert torch.equal(s, x[:, :, layout.positions(24, r, world, lb)])
        assert torch.equal(layout.assemble(shards, load_balance=lb), x)
    with pytest.raises(ValueError, match="x: the global sequence length 24 must be a positive multiple of 10"):
        layout.shard(x, 0, 5)
    with pytest.raises(ValueError, match="load_balance"):
        layout.shard(x, 0, 2, load_balance="ring")
