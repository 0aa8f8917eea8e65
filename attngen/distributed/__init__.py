"""Context parallelism: attention over a sequence sharded across the ranks of a torch.distributed
group, forward and backward, with attngen's kernels as the per-shard attention inside PyTorch's
ring (docs/distributed.md).

    import attngen.distributed as agd
    q, k, v = (agd.shard(x) for x in (q_full, k_full, v_full))   # this rank's zig-zag chunks
    out = agd.attention(q, k, v, causal=True)                    # this rank's rows
    full = agd.unshard(out)
"""

from attngen.distributed.public import attention, positions, shard, unshard

__all__ = ["attention", "positions", "shard", "unshard"]
