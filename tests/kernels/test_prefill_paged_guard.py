"""Paged prefill metadata out of range (issue 51's rule for attention_varlen with block_table), in
Triton's interpreter. Every case runs in a subprocess: a kernel that reads outside a tensor there
kills the process, a failed test rather than a dead suite.

* the public call with CPU metadata raises a ValueError naming `seqused_k`, `cu_seqlens_k` or
  `block_table`, the sequence and the value;
* the kernel with no host check (as a GPU call runs it): a key count is clamped into the table's
  capacity, a page outside the pool is never read (the sequence's output is then not meaningful,
  but finite), the other sequences are exact, and the device flag names the argument through
  attngen.check_kvcache(), which then clears it.
The same cases on a GPU: tests/gpu/test_gpu_prefill_paged.py."""

from __future__ import annotations

import math

import pytest
import torch

from tests.kernels.test_kvcache_guard import close
from tests.kernels.test_kvcache_guard import isolated as run_isolated
from tests.kernels.test_kvcache_guard import run_all
from tests.kernels.test_prefill_paged import cumulative, make_paged, reference

LQ, BUILT, HQ, HKV, D, PAGE = [5, 20], [30, 50], 4, 2, 32, 16
TABLE, KEYS = 1, 5  # the flag slots (attngen.families.prefill_paged.FLAG_SLOTS, test_flag_slots)
SPARE = 3  # spare pages of the pool: the padding of the "junk" cases points at them

# name -> (seqused_k or None (cu_seqlens_k's counts), cu_seqlens_k, {(row, entry): value} table
#          edits, the public call's error (None: valid), the flag slots the kernel sets)
CASES = {
    "seqused_past_capacity": ([30, 81], None, {}, "seqused_k: entry 1 is 81", {KEYS}),
    "seqused_far_past_capacity": ([2**31 - 1, 50], None, {}, "seqused_k: entry 0 is 2147483647", {KEYS}),
    "seqused_negative": ([-4, 50], None, {}, "seqused_k: entry 0 is -4", {KEYS}),
    "cu_seqlens_k_past_capacity": (None, [0, 30, 200], {}, "cu_seqlens_k: sequence 1 has 170 keys", {KEYS}),
    "cu_seqlens_k_decreasing": (None, [0, 30, 10], {}, "cu_seqlens_k: sequence 1 has -20 keys", {KEYS}),
    "page_past_pool": ([30, 50], None, {(1, 1): 999}, "block_table: row 1, entry 1 is 999", {TABLE}),
    "negative_page": ([30, 50], None, {(0, 0): -1}, "block_table: row 0, entry 0 is -1", {TABLE}),
    "padding_past_used_pages": ([30, 50], None, {(0, 2): -1, (0, 4): 10**6, (1, 4): -7}, None, set()),
    "both": ([100, 50], None, {(1, 3): -2}, "seqused_k: entry 0 is 100", {KEYS, TABLE}),
}


def isolated(name: str, *args) -> None:
    run_isolated(name, *args, module="tests.kernels.test_prefill_paged_guard")


def make(name: str):
    """(q, k_pages, v_pages, table, cu_q, cu_k, seqused_k) of a case: the pages of BUILT keys per
    sequence, the table one entry wider than needed, its padding a spare page (valid, never used
    by a valid call) before the case's edits."""
    used, cu_k, edits = CASES[name][:3]
    kp, vp, table = make_paged(BUILT, HKV, D, torch.float16, PAGE, seed=11, spare=SPARE, room=1)
    table[table < 0] = kp.shape[0] - 1  # a spare page
    for (row, col), value in edits.items():
        table[row, col] = value
    g = torch.Generator().manual_seed(12)
    q = torch.randn(sum(LQ), HQ, D, generator=g).to(torch.float16)
    return (q, kp, vp, table, cumulative(LQ), None if cu_k is None else torch.tensor(cu_k, dtype=torch.int32),
            None if used is None else torch.tensor(used, dtype=torch.int32))


def expected(q, kp, vp, table, cu_k, seqused):
    """What the kernel's semantics give in float64: each sequence's key count clamped into
    [0, capacity]; a sequence whose used pages include one outside the pool: NaN (unspecified,
    close() asks for finite values or -inf there)."""
    counts = seqused.tolist() if seqused is not None else (cu_k[1:] - cu_k[:-1]).tolist()
    cap, pool = table.shape[1] * PAGE, kp.shape[0]
    outs, lses = [], []
    cq = cumulative(LQ).tolist()
    for b, n in enumerate(counts):
        n = min(max(n, 0), cap)
        pages = table[b, :-(-n // PAGE)].tolist()
        qb = q[cq[b]:cq[b + 1]]
        if any(not 0 <= p < pool for p in pages):
            outs.append(torch.full((LQ[b], HQ, D), float("nan"), dtype=torch.float64))
            lses.append(torch.full((HQ, LQ[b]), float("nan"), dtype=torch.float64))
            continue
        k = kp[torch.tensor(pages, dtype=torch.long)].reshape(-1, HKV, D)[:n]
        v = vp[torch.tensor(pages, dtype=torch.long)].reshape(-1, HKV, D)[:n]
        o, lse = reference(qb, k, v, [LQ[b]], [n], True, (-1, -1), 0.0, 1 / math.sqrt(D))
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses, dim=1)


def case_public(name: str) -> None:
    """The public call on CPU metadata: the named error, or (valid) the right answer."""
    import attngen

    q, kp, vp, table, cu_q, cu_k, used = make(name)
    message = CASES[name][3]
    with torch.no_grad():
        if message is not None:
            with pytest.raises(ValueError, match=message.replace("(", r"\(")):
                attngen.attention_varlen(q, kp, vp, cu_q, cu_k, max(LQ), 0, causal=True, block_table=table,
                                         seqused_k=used)
            return
        out, lse = attngen.attention_varlen(q, kp, vp, cu_q, cu_k, max(LQ), 0, causal=True, block_table=table,
                                            seqused_k=used, return_lse=True)
    o64, l64 = expected(q, kp, vp, table, cu_k, used)
    close(f"{name} out", out, o64)
    close(f"{name} lse", lse, l64)
    attngen.check_kvcache()  # nothing flagged


def case_kernels(name: str) -> None:
    """The kernel on the case's metadata with no host check, the runtime's device flag: a flagged
    clamp, nothing read outside the cache, check_kvcache() naming the argument once."""
    import attngen
    from attngen.families import prefill_paged as fp
    from attngen.interp import patch_interpreter
    from attngen.kernels.common import MaskArgs
    from attngen.runtime import kvguard, loader
    from attngen.spec import KernelSpec

    patch_interpreter()
    q, kp, vp, table, cu_q, cu_k, used = make(name)
    spec = KernelSpec("prefill_paged", "fp16", "sm80", D, D, HQ // HKV, "causal")
    out = torch.full((sum(LQ), HQ, D), float("nan"), dtype=torch.float16)
    lse = torch.full((HQ, sum(LQ)), float("nan"))
    flags = kvguard.flags(q.device)
    for cfg in (fp.PrefillPagedConfig(16, 16, 4, 1), fp.PrefillPagedConfig(64, 32, 4, 1, pack_gqa=False)):
        for la in fp.prefill_paged_launches(loader.load(spec), spec, q, kp, vp, out, lse, cu_q, cu_k, used, table,
                                            max(LQ), MaskArgs(1 / math.sqrt(D), 0.0, 1 << 30, 0, False), cfg, flags):
            la.run()
        slots = {i for i, f in enumerate(flags.tolist()) if f}
        assert slots == CASES[name][4], f"{name} {cfg}: flag slots {slots} set ({flags.tolist()})"
        o64, l64 = expected(q, kp, vp, table, cu_k, used)
        close(f"{name} {cfg} out", out, o64)
        close(f"{name} {cfg} lse", lse, l64)
        if slots:
            argument = "seqused_k" if KEYS in slots else "block_table"
            with pytest.raises(ValueError, match=argument):
                attngen.check_kvcache()
        attngen.check_kvcache()  # cleared


def cases(kind: str) -> None:
    """Every case through case_<kind> in one process; the failures together."""
    run_all(CASES, globals()["case_" + kind])


@pytest.mark.parametrize("kind", ["public", "kernels"])
def test_cases(kind):
    isolated("cases", kind)


def test_flag_slots():
    from attngen.families import decode as fd
    from attngen.families import prefill_paged as fp

    assert fp.FLAG_SLOTS == {"FLAG_TABLE": TABLE, "FLAG_KEYS": KEYS}
    assert fd.FLAG_SLOTS["FLAG_TABLE"] == TABLE and KEYS not in fd.FLAG_SLOTS.values()
