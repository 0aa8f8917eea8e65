"""Where a context-parallel sequence lives: which chunks of the global sequence each rank holds,
and the helpers that cut a full tensor into a rank's shard and put the shards back together.

The global sequence of S tokens is cut into equal chunks of S / n tokens:

* load_balance="zigzag" (PyTorch's head-tail layout, `_HeadTailLoadBalancer`): n = 2W chunks, rank
  r holds chunks r and 2W-1-r, in that order. Under a causal mask every rank then has the same
  amount of work.
* load_balance=None: n = W chunks, rank r holds chunk r (contiguous shards).

A rank's local tensor is its chunks concatenated along the sequence dimension.
"""

from __future__ import annotations

import torch

LOAD_BALANCES = ("zigzag", None)


def check_load_balance(load_balance) -> None:
    if load_balance not in LOAD_BALANCES:
        raise ValueError(f"load_balance: must be 'zigzag' or None, got {load_balance!r}")


def chunks_per_rank(load_balance) -> int:
    check_load_balance(load_balance)
    return 2 if load_balance == "zigzag" else 1


def rank_chunks(rank: int, world: int, load_balance) -> tuple[int, ...]:
    """The global chunk indices rank `rank` holds, in local order."""
    if chunks_per_rank(load_balance) == 2:
        return (rank, 2 * world - 1 - rank)
    return (rank,)


def check_seqlen(seqlen: int, world: int, load_balance, name: str = "seqlen") -> int:
    """The chunk length of a global sequence of `seqlen` tokens; errors name `name`."""
    n = world * chunks_per_rank(load_balance)
    if seqlen <= 0 or seqlen % n:
        raise ValueError(f"{name}: the global sequence length {seqlen} must be a positive multiple of "
                         f"{n} ({world} ranks x {chunks_per_rank(load_balance)} chunks each, "
                         f"load_balance={load_balance!r}); pad the sequence")
    return seqlen // n


def positions(seqlen: int, rank: int, world: int, load_balance="zigzag", device=None) -> torch.Tensor:
    """The global positions (int64) of rank `rank`'s local tokens, in local order: the index a
    rotary embedding or a loss mask needs for each local token."""
    c = check_seqlen(seqlen, world, load_balance)
    return torch.cat([torch.arange(a * c, (a + 1) * c, device=device)
                      for a in rank_chunks(rank, world, load_balance)])


def shard(x: torch.Tensor, rank: int, world: int, *, seq_dim: int = 2, load_balance="zigzag") -> torch.Tensor:
    """Rank `rank`'s shard of the full tensor x (a contiguous copy): its chunks of x along seq_dim."""
    c = check_seqlen(x.shape[seq_dim], world, load_balance, "x")
    parts = [x.narrow(seq_dim, a * c, c) for a in rank_chunks(rank, world, load_balance)]
    return torch.cat(parts, dim=seq_dim).contiguous()


def assemble(shards, *, seq_dim: int = 2, load_balance="zigzag") -> torch.Tensor:
    """The full tensor from every rank's shard (shards[r] is rank r's): shard()'s inverse."""
    world = len(shards)
    per = chunks_per_rank(load_balance)
    c = shards[0].shape[seq_dim] // per
    chunks = [None] * (world * per)
    for r, s in enumerate(shards):
        if s.shape[seq_dim] != c * per:
            raise ValueError(f"shards: rank {r}'s shard has {s.shape[seq_dim]} tokens along dim {seq_dim}, "
                             f"rank 0's has {c * per}")
        for i, a in enumerate(rank_chunks(r, world, load_balance)):
            chunks[a] = s.narrow(seq_dim, i * c, c)
    return torch.cat(chunks, dim=seq_dim)
