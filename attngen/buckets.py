"""Shape buckets: the unit a launch config is chosen (and tuned) for.

A call's shape falls into one bucket; the runtime keeps one launch plan per bucket, the tuner keeps
one study and one winner per (kernel, device class, bucket). Buckets are coarse on purpose: configs
change with the order of magnitude of a sequence length, not with its last digits, and a length
that moves within a bucket must not change the config (that would compile another kernel).

Classes (all powers of two, so a bucket prints and parses as ``q4096_k4096_bh64``):
  seqlen_q    1 is the decode-like bucket (Sq == 1, reserved for the split-KV family); otherwise the
              next power of two of Sq, clamped to [SEQ_MIN, SEQ_MAX]
  seqlen_k    the same for Sk (packed documents: the longest document)
  batch_heads the next power of two of batch * query heads (documents * heads when packed), clamped
              to [1, BH_MAX]: how many programs one query block spreads over
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

SEQ_MIN = 16
SEQ_MAX = 1 << 20
BH_MAX = 1 << 12
_RE = re.compile(r"q(\d+)_k(\d+)_bh(\d+)")


def _pow2_class(n: int, lo: int, hi: int) -> int:
    n = min(max(n, lo), hi)
    return 1 << (n - 1).bit_length()


@dataclass(frozen=True, order=True)
class ShapeBucket:
    seqlen_q: int
    seqlen_k: int
    batch_heads: int

    @property
    def key(self) -> str:
        return f"q{self.seqlen_q}_k{self.seqlen_k}_bh{self.batch_heads}"

    def __str__(self) -> str:
        return self.key

    @property
    def decode(self) -> bool:
        return self.seqlen_q == 1

    def distance(self, other: "ShapeBucket") -> float:
        """How far two buckets are apart, in powers of two (the nearest tuned bucket serves a shape
        nobody tuned). Sequence lengths weigh more than the batch x heads class."""
        return (abs(math.log2(self.seqlen_q) - math.log2(other.seqlen_q))
                + abs(math.log2(self.seqlen_k) - math.log2(other.seqlen_k))
                + 0.5 * abs(math.log2(self.batch_heads) - math.log2(other.batch_heads)))


def bucket_of(seqlen_q: int, seqlen_k: int, batch_heads: int) -> ShapeBucket:
    """The bucket of a call's shape (cheap: three bit_length calls)."""
    q = 1 if seqlen_q == 1 else _pow2_class(seqlen_q, SEQ_MIN, SEQ_MAX)
    return ShapeBucket(q, _pow2_class(seqlen_k, SEQ_MIN, SEQ_MAX), _pow2_class(batch_heads, 1, BH_MAX))


def parse_bucket(text: str) -> ShapeBucket:
    """``q4096_k4096_bh64`` -> ShapeBucket; a clear ValueError otherwise."""
    m = _RE.fullmatch(text.strip())
    if not m:
        raise ValueError(f"shape bucket {text!r}: expected q<Sq>_k<Sk>_bh<B*H>, e.g. q4096_k4096_bh64")
    sq, sk, bh = (int(x) for x in m.groups())
    b = bucket_of(sq, sk, bh)
    if (b.seqlen_q, b.seqlen_k, b.batch_heads) != (sq, sk, bh):
        raise ValueError(f"shape bucket {text!r}: classes are powers of two (Sq 1 or {SEQ_MIN}.."
                         f"{SEQ_MAX}, Sk {SEQ_MIN}..{SEQ_MAX}, B*H 1..{BH_MAX}); nearest is {b.key}")
    return b


def nearest(bucket: ShapeBucket, candidates) -> ShapeBucket | None:
    """The candidate closest to `bucket` (ties: the smaller one, so the choice is stable)."""
    best = None
    for c in candidates:
        if c.decode != bucket.decode:
            continue
        d = bucket.distance(c)
        if best is None or (d, c) < best:
            best = (d, c)
    return best[1] if best else None
