"""KV-cache metadata out of range (issue 51), in Triton's interpreter. Every case runs in a
subprocess (a kernel that reads outside a tensor there kills the process: a failed test, not a dead
suite):

* the public call with CPU metadata raises a ValueError naming `cache_seqlens` / `block_table` and
  the row, and writes nothing into the caches;
* the kernels with no host check (as a GPU call runs): the row is clamped to its capacity, a bad
  page is never read (page 0 in its place, that slice's result dropped), a new token with no room is not written, and the device flag names
  the row (attngen.runtime.kvguard);
* a seeded fuzz over random tables (-1 padding past the used pages), lengths and appends, valid
  and invalid, through both paths: valid rows against a float64 reference, invalid calls a clear
  error (public) or a flagged clamp (kernels), the caches after an append exactly what the rows
  may write (nothing outside a row's own pages).
The same cases on a GPU, under compute-sanitizer: tests/gpu/test_gpu_kvcache_guard.py."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch

from attngen.env import REPO_ROOT

D, HQ, HKV, PAGE = 32, 4, 2, 16
DTYPE = torch.float16
SEQLENS, TABLE, APPEND = 0, 1, 2  # attngen.families.decode.FLAG_SLOTS, checked in test_flag_slots

# name -> (page (0: dense), pages in the pool (dense: S_max), block table, cache_seqlens, new tokens,
#          the public call's error (None: valid), the flag slots the kernels set)
CASES = {
    "seqlen_one_past_table": (PAGE, 4, [[0]], [17], 0, "cache_seqlens: row 0 holds 17 keys", {SEQLENS}),
    "seqlen_far_past_table": (PAGE, 4, [[0]], [40], 0, "cache_seqlens: row 0 holds 40 keys", {SEQLENS}),
    "page_past_pool": (PAGE, 4, [[9]], [5], 0, "block_table: row 0, entry 0 is 9", {TABLE}),
    "negative_page": (PAGE, 4, [[2, 1], [-1, 0]], [3, 20], 0, "block_table: row 1, entry 0 is -1", {TABLE}),
    "negative_seqlen": (PAGE, 4, [[0, 1], [2, 3]], [5, -3], 1, "cache_seqlens: row 1 holds -3", {SEQLENS, APPEND}),
    "append_at_capacity": (PAGE, 4, [[1]], [16], 1, "cache_seqlens: row 0 holds 16 keys \\+ 1 new",
                           {SEQLENS, APPEND}),
    "append_into_bad_page": (PAGE, 4, [[3, 7]], [15], 2, "block_table: row 0, entry 1 is 7", {TABLE}),
    "dense_past_s_max": (0, 32, None, [4, 33], 0, "cache_seqlens: row 1 holds 33 keys", {SEQLENS}),
    "dense_append_past_s_max": (0, 32, None, [31, 2], 2, "cache_seqlens: row 0 holds 31 keys \\+ 2 new",
                                {SEQLENS, APPEND}),
    "padding_past_used_pages": (PAGE, 6, [[4, 2, -1, 99], [5, -7, -1, -1]], [20, 14], 2, None, set()),
}


def isolated(name: str, *args, module: str = "tests.kernels.test_kvcache_guard") -> None:
    """Run `module`'s (this one's) function `name`(*args) in a fresh interpreter process."""
    code = f"import {module} as t; t.{name}(*{args!r})"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, (f"{name}{args}: exit code {r.returncode} (a segmentation fault shows as -11 or 139)\n"
                               f"stdout: {r.stdout[-3000:]}\nstderr: {r.stderr[-5000:]}")


def make(case: str | tuple, seed: int = 0, device="cpu"):
    """(q, k_cache, v_cache, table, seqlens, k_new, v_new, page) of a case."""
    page, pages, table, lens, new = CASES[case][:5] if isinstance(case, str) else case
    B = len(lens)
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(shape, generator=g).to(DTYPE).to(device)

    shape = (pages, page, HKV, D) if page else (B, pages, HKV, D)
    kc, vc = randn(*shape), randn(*shape)
    q = randn(B, 1, HQ, D)
    kn, vn = (randn(B, new, HKV, D), randn(B, new, HKV, D)) if new else (None, None)
    bt = None if table is None else torch.tensor(table, dtype=torch.int32, device=device)
    return q, kc, vc, bt, torch.tensor(lens, dtype=torch.int32, device=device), kn, vn, page


def expected(q, kc, vc, bt, seqlens, kn, vn, page):
    """What the kernels' semantics give, in float64: (caches after the append, out (B, Sq, Hq, D),
    lse (B, Hq, Sq), flag slots). A row's cache_seqlens is clamped into [0, capacity - new]; a new
    token is written where its position is in [0, capacity) and its page in [0, num_pages); a row
    that uses a page outside the pool reads none of it, but which of its other keys it reads
    depends on the split: its out and lse are NaN here (unspecified; close() asks them finite or
    an empty row's)."""
    B, sq = q.shape[:2]
    new = 0 if kn is None else kn.shape[1]
    pages = kc.shape[0]
    cap = bt.shape[1] * page if page else kc.shape[1]
    kc, vc = kc.clone(), vc.clone()
    flags = set()

    def where(b, pos):  # (index into the cache, ok) of key position pos of row b
        if not page:
            return (b, pos), True
        p = int(bt[b, pos // page])
        return (p, pos % page), 0 <= p < pages

    for b in range(B):
        cs = int(seqlens[b])
        if cs < 0 or cs > cap - new:
            flags.add(SEQLENS)
        for t in range(new):
            if not (cs >= 0 and cs + t < cap):
                flags.add(APPEND)
                continue
            at, ok = where(b, cs + t)
            if not ok:
                flags.add(TABLE)
                continue
            kc[at], vc[at] = kn[b, t], vn[b, t]
    out = torch.zeros(B, sq, HQ, vc.shape[-1], dtype=torch.float64)
    lse = torch.full((B, HQ, sq), float("-inf"), dtype=torch.float64)
    for b in range(B):
        kv = min(max(int(seqlens[b]), 0), cap - new) + new
        keys, vals, pos, ok = [], [], [], True
        for j in range(kv):
            at, ok = where(b, j)
            if not ok:
                flags.add(TABLE)
                out[b], lse[b] = float("nan"), float("nan")
                break
            keys.append(kc[at].double())
            vals.append(vc[at].double())
            pos.append(j)
        if not keys or not ok:
            continue
        k, v = torch.stack(keys), torch.stack(vals)  # (n, Hkv, D)
        k, v = k.repeat_interleave(HQ // HKV, 1), v.repeat_interleave(HQ // HKV, 1)
        s = torch.einsum("qhd,nhd->hqn", q[b].double(), k) / math.sqrt(D)
        seen = torch.tensor(pos)[None, :] <= (kv - sq + torch.arange(sq))[:, None]  # causal, bottom-right
        s = s.masked_fill(~seen[None], float("-inf"))
        lse[b] = torch.logsumexp(s, -1)
        out[b] = torch.einsum("hqn,nhd->qhd", torch.softmax(s, -1).nan_to_num(0.0), v)
    return kc, vc, out, lse, flags


def close(what: str, got, want, atol=4e-3, rtol=1e-2) -> None:
    """|got - want| <= atol + rtol |want|, -inf where want is; where want is NaN (unspecified) got
    finite or -inf (an lse of no key)."""
    got = got.double()
    free = torch.isnan(want)
    assert not (torch.isnan(got) | (got == float("inf")))[free].any(), f"{what}: NaN or inf where any value goes"
    got, want = got.masked_fill(free, 0.0), want.masked_fill(free, 0.0)
    both_inf = torch.isinf(want) & (got == want)
    err = torch.where(both_inf, 0.0, (got - want).abs() - rtol * want.abs().nan_to_num(0.0, 0.0, 0.0))
    worst = float(err.nan_to_num(float("inf")).max()) if err.numel() else 0.0
    assert worst <= atol, f"{what}: worst |got - want| - rtol|want| = {worst:.3g} > {atol}"


def run_kernels(q, kc, vc, bt, seqlens, kn, vn, page, block_n=16, splits=0, **kw):
    """The decode family's launches with no host check (as a GPU call runs them): (out, lse, flags);
    kw: more decode_launches arguments (cache_batch_idx, cache_leftpad)."""
    from attngen.families import decode as fd
    from attngen.interp import patch_interpreter
    from attngen.kernels.common import MaskArgs
    from attngen.runtime import loader
    from attngen.spec import KernelSpec

    patch_interpreter()
    B, sq = q.shape[:2]
    spec = KernelSpec("decode", "fp16", "sm80", D, D, HQ // HKV, "causal", False, False)
    mod = loader.load(spec)
    cap = bt.shape[1] * page if page else kc.shape[1]
    cfg = fd.DecodeConfig(block_n, 4, 1, splits)
    n, split_len = fd.splits(cfg, B, HKV, cap, 2)
    out = torch.full((B, sq, HQ, D), float("nan"), dtype=DTYPE)
    lse = torch.full((B, HQ, sq), float("nan"))
    ps, ls = fd.partial_shapes(B, HKV, n, fd.rows_tile(HQ // HKV, sq), D)
    op, lp = torch.full(ps, float("nan")), torch.full(ls, float("nan"))
    flags = torch.zeros(fd.NUM_FLAGS, dtype=torch.int32)
    new = 0 if kn is None else kn.shape[1]
    for la in fd.decode_launches(mod, spec, q, kc, vc, out, lse, op, lp, MaskArgs(1 / math.sqrt(D), 0.0, -1, 0, False),
                                 cfg, n, split_len, seqlens, bt, new, flags=flags, k_new=kn, v_new=vn, **kw):
        la.run()
    return out, lse, flags


def case_public(name: str) -> None:
    """The public call on CPU metadata: the named error and untouched caches, or (valid) the right answer."""
    import attngen

    q, kc, vc, bt, seqlens, kn, vn, page = make(name)
    message = CASES[name][5]
    k0, v0 = kc.clone(), vc.clone()
    with torch.no_grad():
        if message is not None:
            with pytest.raises(ValueError, match=message):
                attngen.attention_with_kvcache(q, kc, vc, seqlens, k=kn, v=vn, block_table=bt)
            assert torch.equal(kc, k0) and torch.equal(vc, v0), f"{name}: the caches changed on an error"
            return
        out, lse = attngen.attention_with_kvcache(q, kc, vc, seqlens, k=kn, v=vn, block_table=bt, return_lse=True)
    ke, ve, o64, l64, _ = expected(q, k0, v0, bt, seqlens, kn, vn, page)
    assert torch.equal(kc, ke) and torch.equal(vc, ve), f"{name}: the append wrote elsewhere"
    close(f"{name} out", out, o64)
    close(f"{name} lse", lse, l64)
    attngen.check_kvcache()  # nothing flagged


def case_kernels(name: str) -> None:
    """The kernels on the case's metadata with no host check: a flagged clamp, and nothing written
    or read outside the caches."""
    q, kc, vc, bt, seqlens, kn, vn, page = make(name)
    ke, ve, o64, l64, slots = expected(q, kc, vc, bt, seqlens, kn, vn, page)
    assert slots == CASES[name][6], f"{name}: the reference flags {slots}"
    out, lse, flags = run_kernels(q, kc, vc, bt, seqlens, kn, vn, page)
    rows = {i for i, f in enumerate(flags.tolist()) if f}
    assert rows == slots, f"{name}: flag slots {rows} set ({flags.tolist()}), expected {slots}"
    assert torch.equal(kc, ke) and torch.equal(vc, ve), f"{name}: the append wrote outside the rows' own slots"
    close(f"{name} out", out, o64)
    close(f"{name} lse", lse, l64)


def run_all(names, fn) -> None:
    """fn(name) for every name (one process: the imports are most of a case's time); the failures
    together."""
    failed = []
    for name in names:
        try:
            fn(name)
        except Exception as e:  # noqa: BLE001 - each case's failure is reported
            failed.append(f"{name}: {type(e).__name__}: {e}")
    assert not failed, "\n".join(failed)


def cases(kind: str) -> None:
    """Every case of CASES through case_<kind> (the kernels: those that flag something)."""
    run_all([n for n in CASES if kind != "kernels" or CASES[n][6]], globals()["case_" + kind])


@pytest.mark.parametrize("kind", ["public", "kernels"])
def test_cases(kind):
    isolated("cases", kind)


def fuzz(seed: int, trials: int) -> None:
    """Random paged / dense caches, tables (pages shuffled, -1 or junk past the used pages),
    lengths and appends; a third of the trials valid. Each trial runs the public call (valid: the
    right answer and cache; invalid: the named error, nothing written) and the bare kernels (the
    flagged clamp: expected())."""
    import attngen

    g = torch.Generator().manual_seed(seed)

    def rint(lo, hi):  # [lo, hi]
        return int(torch.randint(lo, hi + 1, (1,), generator=g))

    for trial in range(trials):
        B, new, paged = rint(1, 3), rint(0, 2), rint(0, 2) > 0
        sq = rint(1, 2)
        if paged:
            max_pages, pages = rint(1, 3), rint(2, 8)
            cap = max_pages * PAGE
            pages = max(pages, B * max_pages)
            table = torch.randperm(pages, generator=g)[:B * max_pages].reshape(B, max_pages)
        else:
            cap, table = rint(16, 48), None
        lens = [rint(0, cap - new) for _ in range(B)]
        if paged:  # entries past a row's used pages: padding or junk
            for b in range(B):
                used = -(-(lens[b] + new) // PAGE)
                table[b, used:] = torch.tensor([-1, 1000, -5])[torch.randint(0, 3, (max_pages - used,), generator=g)]
        kind = rint(0, 5) if trial % 3 else -1  # every third trial valid
        b = rint(0, B - 1)
        if kind == 0:
            lens[b] = cap - new + rint(1, 40)  # past the capacity
        elif kind == 1:
            lens[b] = -rint(1, 20)
        elif kind in (2, 3) and paged and lens[b] + new > 0:  # a used page outside the pool
            used = -(-(lens[b] + new) // PAGE)
            table[b, rint(0, used - 1)] = rint(pages, pages + 5) if kind == 2 else -rint(1, 3)
        elif kind == 4 and new:
            lens[b] = cap - rint(0, new - 1)  # an append that does not fit
        spec = (PAGE if paged else 0, pages if paged else cap, None if table is None else table.tolist(), lens, new)
        q, kc, vc, bt, seqlens, kn, vn, page = make(spec, seed * 1000 + trial)
        if sq > 1:
            q = torch.cat([q, q.flip(2)], 1)
        what = f"seed {seed} trial {trial}: paged={paged} lens={lens} new={new} table={spec[2]}"
        ke, ve, o64, l64, slots = expected(q, kc, vc, bt, seqlens, kn, vn, page)
        k0, v0 = kc.clone(), vc.clone()
        with torch.no_grad():
            if slots:
                try:
                    attngen.attention_with_kvcache(q, kc, vc, seqlens, k=kn, v=vn, block_table=bt)
                except ValueError as e:
                    assert str(e).startswith(("cache_seqlens:", "block_table:")), f"{what}: {e}"
                else:
                    raise AssertionError(f"{what}: no error")
                assert torch.equal(kc, k0) and torch.equal(vc, v0), f"{what}: the caches changed on an error"
            else:
                out, lse = attngen.attention_with_kvcache(q, kc, vc, seqlens, k=kn, v=vn, block_table=bt,
                                                          return_lse=True)
                assert torch.equal(kc, ke) and torch.equal(vc, ve), f"{what}: the append wrote elsewhere"
                close(f"{what} out", out, o64)
                close(f"{what} lse", lse, l64)
                kc, vc = k0.clone(), v0.clone()
        out, lse, flags = run_kernels(q, kc, vc, bt, seqlens, kn, vn, page, block_n=(16, 32)[trial % 2],
                                      splits=rint(0, 3))
        got = {i for i, f in enumerate(flags.tolist()) if f}
        assert got == slots, f"{what}: kernels flagged {flags.tolist()}, expected slots {slots}"
        assert torch.equal(kc, ke) and torch.equal(vc, ve), f"{what}: the kernels' append wrote elsewhere"
        close(f"{what} kernels out", out, o64)
        close(f"{what} kernels lse", lse, l64)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fuzz(seed):
    isolated("fuzz", seed, 20)


def test_flag_slots():
    from attngen.families import decode as fd

    assert fd.FLAG_SLOTS == {"FLAG_SEQLENS": SEQLENS, "FLAG_TABLE": TABLE, "FLAG_APPEND": APPEND,
                             "FLAG_BATCH_IDX": 3, "FLAG_LEFTPAD": 4}  # tests/kernels/test_kvcache_api.py RANGE
