"""attngen.distributed's entry points: context-parallel attention over a torch.distributed
group, and the helpers that shard a sequence the way it expects."""

from __future__ import annotations

import torch
import torch.distributed as dist

from attngen.distributed import layout as seq_layout
from attngen.distributed.expr import global_exprs
from attngen.distributed.plan import Mask
from attngen.distributed.ring import Ring, RingAttention, engine
from attngen.runtime import validate

ROTATES = (None, "allgather", "alltoall")


def _group_info(group) -> tuple[object, int, int]:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("group: torch.distributed is not initialized (call torch.distributed.init_process_group "
                           "first)")
    group = group if group is not None else dist.group.WORLD
    return group, dist.get_rank(group), dist.get_world_size(group)


def _documents(cu_seqlens, seqlen: int) -> tuple | None:
    if cu_seqlens is None:
        return None
    vals = cu_seqlens.tolist() if isinstance(cu_seqlens, torch.Tensor) else list(cu_seqlens)
    if not vals or not all(isinstance(x, int) and not isinstance(x, bool) for x in vals):
        raise ValueError("cu_seqlens: expected the global document boundaries as ints (0, ..., seqlen)")
    if vals[0] != 0 or vals[-1] != seqlen:
        raise ValueError(f"cu_seqlens: must start at 0 and end at the global sequence length {seqlen} (local length x "
                         f"world size), got {vals[0]} .. {vals[-1]}")
    if any(b < a for a, b in zip(vals, vals[1:])):
        raise ValueError("cu_seqlens: must be non-decreasing")
    return tuple(dict.fromkeys(vals))  # empty documents dropped


def ring_of(q, k, v, *, group=None, causal=False, window_size=(-1, -1), softcap=0.0, scale=None, layout="bhsd",
            load_balance="zigzag", cu_seqlens=None, mask_mod=None, score_mod=None, params=None,
            deterministic=False, rotate=None, world=None, rank=None) -> Ring:
    """The validated Ring of a call (world / rank given: no process group needed)."""
    validate.check_dense(q, k, v, layout)
    qv, kv, _ = validate.dense_views(q, k, v, layout)
    if qv.shape[2] != kv.shape[2]:
        raise ValueError(f"k: context parallelism shards one sequence: q's local length {qv.shape[2]} differs from "
                         f"k's {kv.shape[2]}")
    left, right = validate.check_options(window_size, softcap, scale)
    seq_layout.check_load_balance(load_balance)
    if rotate not in ROTATES:
        raise ValueError(f"rotate: must be None (torch's setting), 'allgather' or 'alltoall', got {rotate!r}")
    if world is None:
        group, rank, world = _group_info(group)
    seqlen = qv.shape[2] * world
    per = seq_layout.chunks_per_rank(load_balance)
    if qv.shape[2] % per:
        raise ValueError(f"q: the local sequence length {qv.shape[2]} must be a multiple of {per} "
                         f"(load_balance={load_balance!r} holds {per} chunks a rank)")
    docs = _documents(cu_seqlens, seqlen)
    if docs is not None and (mask_mod is not None or score_mod is not None):
        raise ValueError("cu_seqlens: documents together with mask_mod / score_mod are not supported under context "
                         "parallelism yet")
    mask_text = score_text = None
    used, params_out = set(), {}
    if mask_mod is not None or score_mod is not None:
        mask_text, score_text, params_out, used = global_exprs(mask_mod, score_mod, params)
    elif params:
        raise ValueError("params: given without mask_mod / score_mod")
    mask = Mask(bool(causal), (left, right), docs, exact_offsets=mask_text is not None or score_text is not None)
    return Ring(group, rank, world, seqlen, load_balance, mask, float(softcap), scale, bool(deterministic), rotate,
                mask_text, score_text, params_out, used)


def attention(q, k, v, *, group=None, causal=False, window_size=(-1, -1), softcap=0.0, scale=None, layout="bhsd",
              load_balance="zigzag", cu_seqlens=None, mask_mod=None, score_mod=None, params=None,
              deterministic=False, return_lse=False, rotate=None):
    """Context-parallel attention: q (B, Hq, S_local, D), k / v (B, Hkv, S_local, D) (layout="bshd":
    (B, S_local, H, D)) are this rank's shard of one global sequence of S_local x world tokens,
    laid out as `load_balance` says ("zigzag": rank r holds chunks r and 2W-1-r of 2W equal
    chunks, PyTorch's head-tail layout; None: chunk r of W). Every rank of `group` (default: the
    whole world) calls it with the same arguments. Returns this rank's rows of the output in q's
    layout, and with return_lse the fp32 log-sum-exp (B, Hq, S_local); differentiable in q, k, v.

    Masks are over GLOBAL positions: causal, window_size (flash-attn (left, right)), cu_seqlens
    (global document boundaries (0, ..., S), the same for every batch row: no token attends
    across a boundary; documents may cross shards), and mask_mod / score_mod (callables or
    expression text as attngen.attention takes them, params their non-learnable tensors), whose
    q_idx / kv_idx / seqlen_q / seqlen_k are global. softcap, scale, deterministic as
    attngen.attention. rotate: how torch moves the K/V shards ("allgather" once, or "alltoall"
    a step; None: torch's current `set_rotate_method` setting). Only K/V heads travel (GQA).
    """
    ring = ring_of(q, k, v, group=group, causal=causal, window_size=window_size, softcap=softcap, scale=scale,
                   layout=layout, load_balance=load_balance, cu_seqlens=cu_seqlens, mask_mod=mask_mod,
                   score_mod=score_mod, params=params, deterministic=deterministic, rotate=rotate)
    engine()
    qv, kv, vv = validate.dense_views(q, k, v, layout)
    out, lse = RingAttention.apply(qv, kv, vv, ring)
    if layout == "bshd":
        out = out.transpose(1, 2)
    return (out, lse) if return_lse else out


def shard(x: torch.Tensor, *, group=None, seq_dim: int = 2, load_balance="zigzag") -> torch.Tensor:
    """This rank's shard of the full tensor x (every rank holds x): its chunks along seq_dim."""
    _, rank, world = _group_info(group)
    return seq_layout.shard(x, rank, world, seq_dim=seq_dim, load_balance=load_balance)


def unshard(x: torch.Tensor, *, group=None, seq_dim: int = 2, load_balance="zigzag") -> torch.Tensor:
    """The full tensor from every rank's shard x (an all-gather; every rank gets it). Not
    differentiable."""
    group, _, world = _group_info(group)
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x, group=group)
    return seq_layout.assemble(parts, seq_dim=seq_dim, load_balance=load_balance)


def positions(seqlen: int, *, group=None, load_balance="zigzag", device=None) -> torch.Tensor:
    """The global positions of this rank's local tokens (rotary embeddings, losses)."""
    _, rank, world = _group_info(group)
    return seq_layout.positions(seqlen, rank, world, load_balance, device)
