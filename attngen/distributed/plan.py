"""Which attention calls one ring step makes: pure host-side geometry, no tensors.

At step i of the ring, rank r holds its own queries and the keys / values of rank (r - i) mod W.
Both are lists of global chunks (attngen.distributed.layout). The global mask is a band on the
key-minus-query distance d = k - q (causal: d <= 0; flash-attn window (left, right): -left <= d <=
right), optionally cut into packed documents. For each (query chunk, key chunk) pair this module
finds the rectangle of pairs the mask keeps (rows and keys that see nothing are trimmed away) and
states it as an ordinary attngen call under top-left alignment: after trimming, the band in the
call's own coordinates always contains the call's top-left corner, so it is a causal mask, a
flash-attn window (left, right) with both sides >= 0, or no mask. Pairs of chunks are merged into
one call where one band states them all exactly (PyTorch's causal load balancing in one call per
step: the first step is one causal call over both local chunks; later steps one full call on
half of the queries or half of the keys). Documents: a chunk against itself is one varlen call
over the documents inside it; two different chunks share at most one document (it spans every
token between them), a plain rectangle.
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass

from attngen.distributed.layout import rank_chunks

INF = float("inf")


@dataclass(frozen=True)
class Mask:
    """The global mask: causal, flash-attn window (left, right) (-1 = unbounded; causal forces
    right = 0), document boundaries (0, ..., S) or None, and whether every call must keep one
    affine map to global positions (expressions: no merged calls)."""

    causal: bool = False
    window: tuple = (-1, -1)
    docs: tuple | None = None
    exact_offsets: bool = False

    def band(self) -> tuple:
        left, right = self.window
        lo = -left if left >= 0 else -INF
        hi = 0 if self.causal else (right if right >= 0 else INF)
        return lo, hi


@dataclass(frozen=True)
class Call:
    """One attngen call of a step: local query rows [rows), local key rows [cols) of the keys
    held at this step; causal / window as attention() takes them, under top-left alignment.
    cu: document boundaries relative to rows[0] for a varlen call (then rows == cols), else None.
    origin: global positions of the first query row and key (None for a merged call)."""

    rows: tuple
    cols: tuple
    causal: bool
    window: tuple
    cu: tuple | None = None
    origin: tuple | None = None


def _trim(q0, q1, k0, k1, lo, hi):
    """The rectangle of rows [q0, q1) x keys [k0, k1) (global) that sees anything under the band
    [lo, hi] on k - q, or None."""
    r0, r1 = max(q0, k0 - hi), min(q1, k1 - lo)
    if r0 >= r1:
        return None
    c0, c1 = max(k0, r0 + lo), min(k1, r1 + hi)
    if c0 >= c1:
        return None
    return int(r0), int(r1), int(c0), int(c1)


def _args(n: int, m: int, lo, hi):
    """(causal, window) of a call of n rows and m keys whose band on j - i is [lo, hi], or None
    when it is not a top-left mask attngen takes (a side of the band past the corner)."""
    left = None if lo <= -(n - 1) else -lo
    right = None if hi >= m - 1 else hi
    if (left is not None and left < 0) or (right is not None and right < 0):
        return None
    if right == 0 and left is None:
        return True, (-1, -1)
    return False, (-1 if left is None else int(left), -1 if right is None else int(right))


def _interval(lo, hi, dlo, dhi):
    a, b = max(lo, dlo), min(hi, dhi)
    return (a, b) if a <= b else None


def _doc(docs: tuple, pos: int) -> tuple:
    i = bisect.bisect_right(docs, pos) - 1
    return docs[i], docs[i + 1]


@dataclass(frozen=True)
class _Piece:
    ia: int  # local query chunk
    ib: int  # local key chunk
    rows: tuple
    cols: tuple
    lo: object  # band on j - i in the piece's own coordinates
    hi: object
    origin: tuple


def _pair(mask: Mask, c: int, ia: int, a: int, ib: int, b: int):
    """The piece of query chunk a (local slot ia) against key chunk b (slot ib): a _Piece, a
    varlen Call (a chunk against itself, documents inside it), or None."""
    lo, hi = mask.band()
    q0, q1, k0, k1 = a * c, (a + 1) * c, b * c, (b + 1) * c
    if mask.docs is not None:
        if a == b:
            inner = tuple(d - q0 for d in mask.docs if q0 < d < q1)
            causal, window = _args(c, c, lo, hi)
            return Call((ia * c, ia * c + c), (ib * c, ib * c + c), causal, window, (0, *inner, c))
        ds, de = _doc(mask.docs, max(q0, k0))  # the one document that may span both chunks
        q0, q1, k0, k1 = max(q0, ds), min(q1, de), max(k0, ds), min(k1, de)
        if q0 >= q1 or k0 >= k1:
            return None
    rect = _trim(q0, q1, k0, k1, lo, hi)
    if rect is None:
        return None
    r0, r1, c0, c1 = rect
    off = c0 - r0
    local_r0, local_c0 = r0 - a * c + ia * c, c0 - b * c + ib * c
    return _Piece(ia, ib, (local_r0, local_r0 + r1 - r0), (local_c0, local_c0 + c1 - c0), lo - off, hi - off,
                  (r0, c0))


def _as_call(p: _Piece) -> Call:
    causal, window = _args(p.rows[1] - p.rows[0], p.cols[1] - p.cols[0], p.lo, p.hi)
    return Call(p.rows, p.cols, causal, window, None, p.origin)


def _merged(mask: Mask, c: int, qa: tuple, kb: tuple, pieces: list):
    """One call for all pieces where a single band states every chunk pair in their bounding box
    exactly (pairs with nothing to compute included), else None."""
    R0, R1 = min(p.rows[0] for p in pieces), max(p.rows[1] for p in pieces)
    C0, C1 = min(p.cols[0] for p in pieces), max(p.cols[1] for p in pieces)
    lo, hi = mask.band()
    cands = [(-INF, INF)] + [(p.lo + (p.cols[0] - C0) - (p.rows[0] - R0), p.hi + (p.cols[0] - C0) - (p.rows[0] - R0))
                             for p in pieces]
    for L, H in cands:
        args = _args(R1 - R0, C1 - C0, L, H)
        if args is None:
            continue
        ok = True
        for ia, a in enumerate(qa):
            rs, re = max(R0, ia * c), min(R1, ia * c + c)
            for ib, b in enumerate(kb):
                cs, ce = max(C0, ib * c), min(C1, ib * c + c)
                if rs >= re or cs >= ce:
                    continue
                # global distance = call distance + sigma over this pair of chunks
                sigma = C0 - R0 + (b - ib) * c - (a - ia) * c
                dlo, dhi = (cs - C0) - (re - 1 - R0), (ce - 1 - C0) - (rs - R0)
                if _interval(lo - sigma, hi - sigma, dlo, dhi) != _interval(L, H, dlo, dhi):
                    ok = False
                    break
            if not ok:
                break
        if ok:
            return Call((R0, R1), (C0, C1), args[0], args[1])
    return None


def _join_docs(calls: list) -> list:
    """Varlen calls on the diagonal that touch join into one; a varlen call of one document is a
    dense call."""
    out = []
    for call in calls:
        prev = out[-1] if out else None
        if (call.cu is not None and prev is not None and prev.cu is not None and prev.rows[1] == call.rows[0]
                and prev.cols[1] == call.cols[0] and (prev.causal, prev.window) == (call.causal, call.window)):
            shift = prev.rows[1] - prev.rows[0]
            cu = prev.cu + tuple(shift + x for x in call.cu[1:])
            out[-1] = Call((prev.rows[0], call.rows[1]), (prev.cols[0], call.cols[1]), call.causal, call.window, cu)
        else:
            out.append(call)
    return [Call(x.rows, x.cols, x.causal, x.window) if x.cu is not None and len(x.cu) == 2 else x for x in out]


@functools.lru_cache(maxsize=4096)
def step_calls(seqlen: int, world: int, rank: int, step: int, load_balance, mask: Mask) -> tuple:
    """The calls rank `rank` makes at ring step `step` (keys of rank (rank - step) mod world)."""
    per = 2 if load_balance == "zigzag" else 1
    c = seqlen // (world * per)
    qa = rank_chunks(rank, world, load_balance)
    kb = rank_chunks((rank - step) % world, world, load_balance)
    pieces, varlen = [], []
    for ia, a in enumerate(qa):
        for ib, b in enumerate(kb):
            p = _pair(mask, c, ia, a, ib, b)
            if isinstance(p, Call):
                varlen.append(p)
            elif p is not None:
                pieces.append(p)
    if mask.docs is not None:
        return tuple(_join_docs(varlen) + [_as_call(p) for p in pieces])
    if len(pieces) > 1 and not mask.exact_offsets:
        one = _merged(mask, c, qa, kb, pieces)
        if one is not None:
            return (one,)
    return tuple(_as_call(p) for p in pieces)
