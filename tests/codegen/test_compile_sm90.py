"""The sm90 kernels compiled for the GPU on a CPU machine (attngen.bench.probe: Triton's own
ptxas, no GPU): what a register knob is for is visible in the compiled code, so a template or
Triton change that silently undoes it fails here, not only as a slower benchmark.

A probe's process spends most of its time starting (torch, Triton), so the probes of the selected
tests run together (`attngen.bench.probe --batch`: one process, under xdist one per worker, up to
two), each once; the tests read their reports through the fixture `probed`, which knows the
probes listed in PROBES."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from filelock import FileLock, Timeout

from attngen.configs import WS_BWD_DEFAULT, WS_BWD_ROLES, WS_DEFAULT, WS_DEFAULT_WIDE, WS_DOCS
from attngen.env import REPO_ROOT


def probe(*args: str, defined: bool = True) -> list[dict]:
    """attngen.bench.probe in a process of its own (Triton's interpreter off there). defined: every
    launch's SASS reads only uniform registers that every path to the read has written (ptxas 12.8
    does not always: attngen.bench.probe.undefined_uniform_reads)."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    res = subprocess.run([sys.executable, "-m", "attngen.bench.probe", *args, "--json"], capture_output=True,
                         text=True, env=env, cwd=REPO_ROOT, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    return checked(json.loads(res.stdout.strip().splitlines()[-1]), defined, args)


def checked(reports: list[dict], defined: bool, args: tuple = ()) -> list[dict]:
    """`reports`, after probe's `defined` check and the fence check: no TMA copy through a
    descriptor the kernel made that the issuing warp-specialized partition never acquired
    (attngen.bench.ptx.unfenced_descriptor_loads; the Gluon backward passes over packed documents
    had 4 each until their producer warp made and fenced its own descriptors: docs/notes.md,
    sessions 60-61)."""
    if defined:
        assert all(r["undefined_uniform_reads"] == [] for r in reports), [
            (r["kernel"], r["num_warps"], r["undefined_uniform_reads"]) for r in reports if r["undefined_uniform_reads"]]
    for r in reports:
        assert r["unfenced_descriptor_loads"] == [], (r["kernel"], args, r["unfenced_descriptor_loads"][:4])
        # strict, until benchmarks/patches/ws_barrier_init_fence.diff lands (docs/notes.md, session
        # 63): the Gluon kernels initialise their mbarriers with no proxy fence before the copy
        # engine completes bytes on them; with the fence this list is empty and this line goes
        if r["kernel"].endswith("_ws"):
            assert r["unfenced_barrier_inits"] != [], (r["kernel"], args)
        # every barrier invalidated before the shared memory goes to the next program: Triton's own
        # TMA lowering does it. Strict for the Gluon kernels until ws_landing.diff (which adds their
        # invalidations and makes this `== 0` for every kernel) lands (docs/notes.md, session 64)
        if r["kernel"].endswith("_ws"):
            assert r["uninvalidated_barriers"] > 0, (r["kernel"], args)
        else:
            assert r["uninvalidated_barriers"] == 0, (r["kernel"], args, r["uninvalidated_barriers"])
    return reports


def run_batch(runs: list[tuple[str, ...]]) -> list:
    """attngen.bench.probe --batch of `runs` in a process of its own: one entry per run, its reports or
    {"error": text}; where the process died, every run's entry is an error holding its output."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    try:
        res = subprocess.run([sys.executable, "-m", "attngen.bench.probe", "--batch", "-"], input=json.dumps(runs),
                             capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=600 * len(runs))
    except subprocess.TimeoutExpired as exc:
        return [{"error": f"probe batch: {exc}"}] * len(runs)
    try:
        entries = json.loads(res.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        entries = None
    if not isinstance(entries, list) or len(entries) != len(runs):
        died = f"probe batch: exit status {res.returncode}\n{res.stdout[-2000:]}{res.stderr[-4000:]}"
        return [{"error": died}] * len(runs)
    return entries


class Batches:
    """The reports of `runs`, in len(shards) batches, each run by one process of the test session
    when first needed. Under xdist the workers share them through files in `shared`: a worker that
    needs a batch another worker is running first runs any batch nobody has started, then waits."""

    def __init__(self, runs: list[tuple[str, ...]], shards: int, shared: Path | None):
        spread = sorted(runs, key=lambda run: run[0] != "bwd")  # backward runs (two kernels) dealt first
        self.shards = [spread[i::shards] for i in range(shards)]  # about even work
        self.shared = shared
        self.entries: dict[tuple[str, ...], object] = {}
        self.done: set[int] = set()

    def __getitem__(self, run: tuple[str, ...]):
        (i,) = [i for i, shard in enumerate(self.shards) if run in shard]
        if i not in self.done and self.shared is None:
            self._keep(i, run_batch(self.shards[i]))
        elif i not in self.done and not self._take(i, wait=False):
            for j in range(len(self.shards)):
                if j not in self.done:
                    self._take(j, wait=False)
            self._take(i, wait=True)
        return self.entries[run]

    def _keep(self, i: int, entries: list) -> None:
        self.entries.update(zip(self.shards[i], entries))
        self.done.add(i)

    def _take(self, i: int, wait: bool) -> bool:
        """Batch i's entries, from the shared file, or run (and shared) here; False when another
        worker holds it and `wait` is off."""
        name = hashlib.sha1(json.dumps(self.shards[i]).encode()).hexdigest()[:16]
        path, lock = self.shared / f"probe-batch-{name}.json", FileLock(self.shared / f"probe-batch-{name}.lock")
        try:
            lock.acquire(timeout=-1 if wait else 0)
        except Timeout:
            return False
        try:
            if not path.exists():
                part = path.with_suffix(".part")
                part.write_text(json.dumps(run_batch(self.shards[i])))
                os.replace(part, path)
            self._keep(i, json.loads(path.read_text()))
        finally:
            lock.release()
        return True


@pytest.fixture(scope="module")
def probed(request, tmp_path_factory):
    """probe(*args, defined=...) of the probes PROBES lists for the selected tests of this module,
    run in batches: a run that failed fails only the tests that read it, with its error."""
    selected = {item.originalname for item in request.session.items
                if getattr(item, "module", None) is request.module}
    runs = list(dict.fromkeys(run for test, listed in PROBES.items() if test in selected for run in listed))
    workers = getattr(request.config, "workerinput", {}).get("workercount", 1)
    shared = tmp_path_factory.getbasetemp().parent if workers > 1 else None  # the session's, all workers'
    batches = Batches(runs, min(2, workers, len(runs)), shared)

    def read(*args: str, defined: bool = True) -> list[dict]:
        assert args in runs, f"probe{args}: not in PROBES under the test's name"
        entry = batches[args]
        assert isinstance(entry, list), entry["error"]
        assert all("error" not in r for r in entry), [r for r in entry if "error" in r]
        return checked(entry, defined, args)

    return read


def _tiles(c) -> str:
    return f"{c.block_m},{c.block_n},{c.num_warps},{c.num_stages}"


def _bwd_tiles(c) -> str:
    return ",".join(map(str, (c.block_m, c.block_n, c.num_warps, c.num_stages, c.dq_block_m, c.dq_block_n,
                              c.dq_num_warps, c.dq_num_stages)))


def _ws_tiles(hd: int) -> str:
    return _tiles(WS_DEFAULT if hd <= 128 else WS_DEFAULT_WIDE)


REGISTER_OPERANDS = [("fwd", "64,64,4,3", "_attn_fwd_tma"), ("bwd", "64,64,4,2,128,64,8,3", "_attn_bwd_dq_tma")]
WS_FORWARDS = [(128, "causal"), (64, "sliding_window"), (256, "causal")]
PAIRED_FORWARDS = [(128, "causal"), (256, "sliding_window")]
ONE_CONSUMER_FORWARDS = [(128, "WS_MAXNREG_ONE"), (256, "WS_MAXNREG")]
WS_BACKWARDS = [(128, "causal", 4), (64, "none", 1), (128, "sliding_window", 1)]
ROLES_BACKWARDS = [("causal", 1), ("sliding_window", 2)]
# head dims of two column tiles (64 + 16, 64 + 32, 128 + 64) on both Gluon passes (two consumers
# up to hd128, split roles at hd192; the dQ pass on 128 query rows of 64-key blocks)
# (and the one-tile passes over packed documents, hd128: the probe's packed backward; the two-tile
# head dims keep the Triton passes there, check_ws_bwd)
TWO_TILE_BACKWARDS = [(80, "causal", 1, False), (96, "sliding_window", 2, False), (192, "causal", 2, False)]


def _two_tile_args(hd: int, mask: str, gqa: int, varlen: bool) -> tuple[str, ...]:
    c = WS_BWD_ROLES if hd > 128 else WS_BWD_DEFAULT
    tiles = f"{c.block_m},{c.block_n},{c.num_warps},{c.num_stages},128,64,4,2"
    return ("bwd", "--hd", str(hd), "--mask", mask, "--gqa", str(gqa), "--config", tiles, "--also", "consumers=2",
            "--also", "dq_consumers=2", *(("--also", "roles=True") if hd > 128 else ()), *(("--varlen",) if varlen else ()))
EXPR = ["--mask-expr", "((kv_idx <= q_idx) and (((q_idx - kv_idx) < 96) or (kv_idx < 4)))",
        "--score-expr", "((score + bias[h, min(abs((kv_idx - q_idx)), 31)]) - (slope[h] * abs((q_idx - kv_idx))))",
        "--param", "bias:hx32:fp32:learnable", "--param", "slope:h:fp32:learnable", "--sinks"]
ALIBI = ["--mask-expr", "kv_idx <= q_idx", "--score-expr", "score - slope[h] * abs(q_idx - kv_idx)",
         "--param", "slope:h:fp32"]
ALIBI_BWD = ["--config", "64,128,4,2,128,64,4,3", "--also", "consumers=2", "--also", "dq_consumers=2"]

# Every probe each test runs (the argument lists of its probed(...) calls, over its parameters).
PROBES: dict[str, list[tuple[str, ...]]] = {
    "test_operands_in_registers_leave_shared_memory": [
        (fam, "--hd", "128", "--mask", "causal", "--config", config, *extra) for fam, config, _ in REGISTER_OPERANDS
        for extra in ((), ("--also", f"{'q_regs' if fam == 'fwd' else 'dq_regs'}=True"))],
    "test_warp_specialized_forward_keeps_a_matmul_in_flight": [
        run for hd, mask in WS_FORWARDS
        for run in (("fwd", "--hd", str(hd), "--mask", mask, "--config", _ws_tiles(hd), "--also", "consumers=2"),
                    ("fwd", "--hd", str(hd), "--mask", mask, "--config", "64,64,4,3"))],
    "test_paired_tiles_forward_compiles_as_the_single_tile_one": [
        ("fwd", "--hd", str(hd), "--mask", mask, "--config", _ws_tiles(hd), "--also", "consumers=2", *extra)
        for hd, mask in PAIRED_FORWARDS for extra in ((), ("--also", "pair_tiles=True"))],
    "test_one_consumer_forward_compiles_at_its_launch_register_cap": [
        ("fwd", "--hd", str(hd), "--gqa", "2", "--mask", "causal", "--config", "64,64,4,2", "--also", "consumers=1")
        for hd, _ in ONE_CONSUMER_FORWARDS],
    "test_packed_documents_forward_default_compiles_without_spilling": [
        ("fwd", "--hd", "128", "--gqa", "4", "--mask", "causal", "--varlen", "--config", _tiles(WS_DOCS),
         "--also", "consumers=2", "--also", "pair_tiles=True", "--also", "persistent=1")],
    "test_warp_specialized_backward_compiles_without_spilling": [
        ("bwd", "--hd", str(hd), "--mask", mask, "--gqa", str(gqa), "--config", _bwd_tiles(WS_BWD_DEFAULT),
         "--also", "consumers=2", "--also", "dq_consumers=2") for hd, mask, gqa in WS_BACKWARDS],
    "test_backward_with_split_roles_compiles_without_spilling_at_hd256": [
        ("bwd", "--hd", "256", "--mask", mask, "--gqa", str(gqa), "--config", _bwd_tiles(WS_BWD_ROLES),
         "--also", "consumers=2", "--also", "roles=True") for mask, gqa in ROLES_BACKWARDS],
    "test_two_tile_backward_compiles_without_spilling": [_two_tile_args(*case) for case in TWO_TILE_BACKWARDS],
    "test_packed_documents_backward_compiles_without_spilling": [
        ("bwd", "--hd", "128", "--gqa", "4", "--mask", "causal", "--varlen", "--config", _bwd_tiles(WS_BWD_DEFAULT),
         "--also", "consumers=2", "--also", "dq_consumers=2")],
    "test_expression_kernels_compile_for_sm90": [
        ("fwd", "--hd", "64", "--gqa", "2", "--config", "64,64,4,2", "--also", "tma=True", *EXPR),
        ("bwd", "--hd", "64", "--gqa", "2", "--config", "64,64,4,2,64,64,4,2", "--also", "tma=True", *EXPR)],
    "test_expression_kernels_compile_as_gluon_kernels": [
        ("fwd", "--hd", "128", "--config", "128,64,4,2", "--also", "consumers=2", *ALIBI),
        ("bwd", "--hd", "128", "--gqa", "4", *ALIBI_BWD, *ALIBI)],
}


@pytest.mark.parametrize("fam, config, kernel", REGISTER_OPERANDS)
def test_operands_in_registers_leave_shared_memory(probed, fam, config, kernel):
    """q_regs (forward) / dq_regs (dQ pass): Q.K^T's wgmma (m64n64k16 here: 64 keys per block)
    reads its A operand from registers instead of shared memory, and the kernel needs less shared
    memory; nothing spills."""
    knob = "q_regs" if fam == "fwd" else "dq_regs"
    off, on = ([r for r in probed(fam, "--hd", "128", "--mask", "causal", "--config", config, *extra)
                if r["kernel"] == kernel][0]
               for extra in ((), ("--also", f"{knob}=True")))
    assert "m64n64k16 A from shared" in off["wgmma"], off
    assert "m64n64k16 A from registers" in on["wgmma"] and "m64n64k16 A from shared" not in on["wgmma"], on
    assert on["shared_bytes"] < off["shared_bytes"], (on, off)
    assert on["registers"] > off["registers"] and on["spill_stores"] == 0, (on, off)


@pytest.mark.parametrize("hd, mask", WS_FORWARDS)
def test_warp_specialized_forward_keeps_a_matmul_in_flight(probed, hd, mask):
    """The Gluon forward (FwdConfig.consumers) waits for Q.K^T with one wgmma group still in
    flight in the PTX (P.V of the previous key block), which the Triton TMA kernel never does
    (ptxas then waits for P.V too before the softmax's exponentials: the probe's main_loop says
    where, docs/notes.md); it compiles without spills under its 168-register cap, with the shared
    memory the model predicts (Q for 128 rows, two K / V stages of 128 keys, 64 at hd256), and
    its main loop holds one key block's work: Q.K^T and P.V in k16 wgmma steps, one ex2 a score
    (64 rows x block_n over 128 threads) plus the thread's two rows' rescale factors."""
    from attngen.spec import KernelSpec
    from attngen.configs import WS_DEFAULT, WS_DEFAULT_WIDE, WS_MAXNREG, fwd_smem_bytes

    cfg = WS_DEFAULT if hd <= 128 else WS_DEFAULT_WIDE
    tiles = f"{cfg.block_m},{cfg.block_n},{cfg.num_warps},{cfg.num_stages}"
    (ws,) = probed("fwd", "--hd", str(hd), "--mask", mask, "--config", tiles, "--also", "consumers=2")
    (tma,) = probed("fwd", "--hd", str(hd), "--mask", mask, "--config", "64,64,4,3")
    assert ws["kernel"] == "_attn_fwd_ws" and tma["kernel"] == "_attn_fwd_tma", (ws, tma)
    assert 1 in ws["wait_groups"] and tma["wait_groups"] == [0], (ws, tma)
    assert ws["spill_stores"] == 0 and ws["registers"] <= WS_MAXNREG, ws
    loop = ws["main_loop"]
    assert loop is not None and loop["local_memory"] == 0, ws
    assert loop["wgmma"] == hd // 16 + cfg.block_n // 16, loop
    assert loop["ex2"] == 64 * cfg.block_n // 128 + 2, loop
    want = fwd_smem_bytes(KernelSpec("fwd", "bf16", "sm90", hd, hd, 1, mask), cfg)
    assert want <= ws["shared_bytes"] <= want + 1024, (want, ws)


@pytest.mark.parametrize("hd, mask", PAIRED_FORWARDS)
def test_paired_tiles_forward_compiles_as_the_single_tile_one(probed, hd, mask):
    """FwdConfig.pair_tiles: the program's two query tiles run one after the other through the
    same consumer code, with the same shared memory (the Q buffers are reloaded, not doubled) and
    at most a few scalars spilled across the tile boundary."""
    from attngen.configs import WS_DEFAULT, WS_DEFAULT_WIDE, WS_MAXNREG

    cfg = WS_DEFAULT if hd <= 128 else WS_DEFAULT_WIDE
    tiles = f"{cfg.block_m},{cfg.block_n},{cfg.num_warps},{cfg.num_stages}"
    (one,) = probed("fwd", "--hd", str(hd), "--mask", mask, "--config", tiles, "--also", "consumers=2")
    (two,) = probed("fwd", "--hd", str(hd), "--mask", mask, "--config", tiles, "--also", "consumers=2",
                    "--also", "pair_tiles=True")
    assert two["kernel"] == "_attn_fwd_ws" and 1 in two["wait_groups"], two
    assert abs(two["shared_bytes"] - one["shared_bytes"]) <= 64, (one, two)
    assert two["registers"] <= WS_MAXNREG and two["spill_stores"] <= 32, two


@pytest.mark.parametrize("hd, cap", ONE_CONSUMER_FORWARDS)
def test_one_consumer_forward_compiles_at_its_launch_register_cap(probed, hd, cap):
    """FwdConfig.consumers=1 (one consumer warp group of 64 rows): the launcher's register cap
    (space.ws_fwd_maxnreg) compiles without spills; at hd256 the 128 of hd <= 192 made ptxas stop
    (the accumulator's wgmma needs 158), so the wide case takes the two-consumer cap."""
    from attngen import configs as space

    (ws,) = probed("fwd", "--hd", str(hd), "--gqa", "2", "--mask", "causal", "--config", "64,64,4,2",
                   "--also", "consumers=1")
    assert ws["kernel"] == "_attn_fwd_ws", ws
    assert ws["spill_stores"] == 0 and ws["registers"] <= getattr(space, cap), ws


def test_packed_documents_forward_default_compiles_without_spilling(probed):
    """WS_DOCS (packed hd128: a persistent program walking mirrored pairs, 64-key blocks, 2
    stages) with the V fix for the key block past a document's end: no spills, shared memory as
    the model predicts."""
    from attngen.spec import KernelSpec
    from attngen.configs import WS_DOCS, WS_MAXNREG, fwd_smem_bytes

    c = WS_DOCS
    (ws,) = probed("fwd", "--hd", "128", "--gqa", "4", "--mask", "causal", "--varlen", "--config",
                   f"{c.block_m},{c.block_n},{c.num_warps},{c.num_stages}", "--also", "consumers=2",
                   "--also", "pair_tiles=True", "--also", "persistent=1")
    assert ws["kernel"] == "_attn_fwd_ws" and 1 in ws["wait_groups"], ws
    assert ws["spill_stores"] == 0 and ws["registers"] <= WS_MAXNREG, ws
    want = fwd_smem_bytes(KernelSpec("fwd", "bf16", "sm90", 128, 128, 4, "causal", varlen=True), c)
    assert want <= ws["shared_bytes"] <= want + 1024, (want, ws)


@pytest.mark.parametrize("hd, mask, gqa", WS_BACKWARDS)
def test_warp_specialized_backward_compiles_without_spilling(probed, hd, mask, gqa):
    """The Gluon dK/dV and dQ passes (BwdConfig.consumers / dq_consumers) under the 168-register
    cap: the dK/dV consumers hold two fp32 accumulators of 64 keys x hd, so the LSE / delta rows
    go through shared memory (at most a few spilled words); the dQ pass keeps the previous key
    block's dS.K in flight across the wait for the next block's scores (wait_group 2)."""
    from attngen.configs import WS_BWD_DEFAULT, WS_MAXNREG

    c = WS_BWD_DEFAULT
    tiles = ",".join(map(str, (c.block_m, c.block_n, c.num_warps, c.num_stages, c.dq_block_m, c.dq_block_n,
                               c.dq_num_warps, c.dq_num_stages)))
    dkdv, dq = probed("bwd", "--hd", str(hd), "--mask", mask, "--gqa", str(gqa), "--config", tiles,
                      "--also", "consumers=2", "--also", "dq_consumers=2")
    assert (dkdv["kernel"], dq["kernel"]) == ("_attn_bwd_dkdv_ws", "_attn_bwd_dq_ws"), (dkdv, dq)
    for r in (dkdv, dq):
        assert r["registers"] <= WS_MAXNREG and r["spill_stores"] <= 32, r
    assert 2 in dq["wait_groups"] and 1 in dkdv["wait_groups"], (dkdv, dq)


@pytest.mark.parametrize("mask, gqa", ROLES_BACKWARDS)
def test_backward_with_split_roles_compiles_without_spilling_at_hd256(probed, mask, gqa):
    """BwdConfig.roles at hd256 (its default): each consumer holds one fp32 accumulator of 64 keys
    x 256 (128 registers a thread) and stays under the 168-register launch cap without spilling;
    its shared memory is the model's (K, V, two Q / dO slots, the fp32 P^T tile) up to barriers."""
    from attngen.spec import KernelSpec
    from attngen.configs import WS_BWD_ROLES, WS_MAXNREG, bwd_smem_bytes

    c = WS_BWD_ROLES
    tiles = ",".join(map(str, (c.block_m, c.block_n, c.num_warps, c.num_stages, c.dq_block_m, c.dq_block_n,
                               c.dq_num_warps, c.dq_num_stages)))
    runs = probed("bwd", "--hd", "256", "--mask", mask, "--gqa", str(gqa), "--config", tiles,
                  "--also", "consumers=2", "--also", "roles=True")
    (dkdv,) = [r for r in runs if r["kernel"] == "_attn_bwd_dkdv_ws"]
    assert dkdv["registers"] <= WS_MAXNREG and dkdv["spill_stores"] == 0, dkdv
    want = bwd_smem_bytes(KernelSpec("bwd", "bf16", "sm90", 256, 256, gqa, mask), c)[0]
    assert want <= dkdv["shared_bytes"] <= want + 1024, (want, dkdv)


@pytest.mark.parametrize("hd, mask, gqa, varlen", TWO_TILE_BACKWARDS)
def test_two_tile_backward_compiles_without_spilling(probed, hd, mask, gqa, varlen):
    """The Gluon passes at head dims of two column tiles: one wgmma per tile, as wide as the tile
    (n16 / n32 / n64 beside the 64- or 128-wide one), under the 168-register launch cap with
    nothing spilled. The dK/dV pass keeps dP^T in flight during P^T's exp2 up to hd128
    (wait_group 2: dP^T is two chained wgmmas); the dQ pass keeps dP and the previous block's dQ
    update in flight (wait_group 4), with Q and dO as register operands up to hd128 and read from
    shared memory at hd192. The dK/dV pass's shared memory is the model's up to barriers and
    alignment."""
    import dataclasses

    from attngen.spec import KernelSpec
    from attngen.configs import WS_MAXNREG, bwd_smem_bytes

    runs = probed(*_two_tile_args(hd, mask, gqa, varlen))
    by = {r["kernel"]: r for r in runs}
    assert set(by) == {"_attn_bwd_dkdv_ws", "_attn_bwd_dq_ws"}, runs
    narrow = {80: 16, 96: 32, 192: 64}[hd]
    for r in runs:
        assert r["registers"] <= WS_MAXNREG and r["spill_stores"] == 0, r
        assert any(f"m64n{narrow}k16" in w for w in r["wgmma"]), r["wgmma"]
    assert 4 in by["_attn_bwd_dq_ws"]["wait_groups"], runs
    if hd <= 128:
        assert 2 in by["_attn_bwd_dkdv_ws"]["wait_groups"], runs
    # S = Q.K^T: Q from registers up to hd128, from shared memory past it
    assert (f"m64n64k16 A from {'registers' if hd <= 128 else 'shared'}" in by["_attn_bwd_dq_ws"]["wgmma"]), runs
    c = dataclasses.replace(WS_BWD_ROLES if hd > 128 else WS_BWD_DEFAULT, dq_block_m=128, dq_block_n=64,
                            dq_num_warps=4, dq_num_stages=2, dq_consumers=2)
    spec = KernelSpec("bwd", "bf16", "sm90", hd, hd, gqa, mask, varlen=varlen)
    dkdv_want, dq_want = bwd_smem_bytes(spec, c)
    # up to barriers, the stat rows and the alignment of each tile's buffers (measured: 1080-1120 B)
    assert dkdv_want <= by["_attn_bwd_dkdv_ws"]["shared_bytes"] <= dkdv_want + 2048, (dkdv_want, runs)
    assert dq_want <= by["_attn_bwd_dq_ws"]["shared_bytes"] <= dq_want + 2048, (dq_want, runs)


def test_packed_documents_backward_compiles_without_spilling(probed):
    """Both Gluon backward passes over packed documents (descriptors made per document in the
    kernel, masked pointer stores), hd128 GQA 4, their default config: under the launch cap, no
    spills."""
    from attngen.configs import WS_MAXNREG

    runs = probed("bwd", "--hd", "128", "--gqa", "4", "--mask", "causal", "--varlen", "--config",
                  _bwd_tiles(WS_BWD_DEFAULT), "--also", "consumers=2", "--also", "dq_consumers=2")
    assert [r["kernel"] for r in runs] == ["_attn_bwd_dkdv_ws", "_attn_bwd_dq_ws"], runs
    for r in runs:
        assert r["registers"] <= WS_MAXNREG and r["spill_stores"] <= 32, r


def test_expression_kernels_compile_for_sm90(probed):
    """An expression kernel's sm90 TMA forward and backward (a mask with gaps, so the forward's
    tile skip; a score modification with a learned bias table and learned per-head slopes; learned
    sinks: the dQ pass's partial sums and exact D) compile with Triton's ptxas, and every launch's
    uniform registers are written before they are read."""
    fwd = probed("fwd", "--hd", "64", "--gqa", "2", "--config", "64,64,4,2", "--also", "tma=True", *EXPR)
    bwd = probed("bwd", "--hd", "64", "--gqa", "2", "--config", "64,64,4,2,64,64,4,2", "--also", "tma=True", *EXPR)
    assert [r["kernel"] for r in fwd] == ["_attn_fwd_tma"], fwd
    assert [r["kernel"] for r in bwd] == ["_attn_bwd_dkdv_tma", "_attn_bwd_dq_tma"], bwd


def test_expression_kernels_compile_as_gluon_kernels(probed):
    """Expressions in the warp-specialized Gluon kernels: ALiBi under a causal mask expression in
    the forward (64-key blocks: no spills, where 128 spilled) and in both backward passes."""
    (fwd,) = probed("fwd", "--hd", "128", "--config", "128,64,4,2", "--also", "consumers=2", *ALIBI)
    assert fwd["kernel"] == "_attn_fwd_ws" and fwd["spill_stores"] == 0, fwd
    bwd = probed("bwd", "--hd", "128", "--gqa", "4", *ALIBI_BWD, *ALIBI)
    assert [r["kernel"] for r in bwd] == ["_attn_bwd_dkdv_ws", "_attn_bwd_dq_ws"], bwd
    # (document ids' runs, XR_, in both Gluon passes: run on the GPU, tests/gpu/test_gpu_expr.py)
