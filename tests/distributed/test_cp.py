"""Context-parallel attention on the CPU: 2 and 4 processes on the gloo backend, attngen's kernels
through Triton's interpreter (tests/distributed/cp_worker.py), each rank's output, LSE and
gradients put back together and checked against the single-process attngen call and a float64
reference by the flash-attn rule (output error <= 2x a same-precision PyTorch implementation's,
gradients <= 3x). A worker that crashes or hangs fails the test (a timeout on the wait)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import attngen
from attngen.distributed import layout
from attngen.problem import attention_ref
from attngen.testing import assert_flash_rule, assert_lse_close, check_grads, max_err
from tests.distributed.cases import CASES, cases_for

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 300


def run_world(world: int, tmp: Path, only: str = "", extra=()) -> list[dict]:
    """Start `world` workers and wait for all of them: the first that fails, or the deadline,
    ends the others and fails the test. Returns each rank's saved results."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    init = f"file://{tmp / 'rendezvous'}"
    logs = [tmp / f"rank{r}.log" for r in range(world)]
    procs = [subprocess.Popen([sys.executable, "-m", "tests.distributed.cp_worker", "--world", str(world), "--rank",
                               str(r), "--init", init, "--out", str(tmp), "--only", only, *extra], cwd=ROOT, env=env,
                              stdout=logs[r].open("w"), stderr=subprocess.STDOUT) for r in range(world)]
    deadline = time.monotonic() + TIMEOUT_S
    hung = []
    try:
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.returncode not in (None, 0) for p in procs):  # the others may follow: a moment for them
                deadline = min(deadline, time.monotonic() + 2.0)
            time.sleep(0.1)
        hung = [r for r, p in enumerate(procs) if p.poll() is None]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    failed = [f"rank {r} of {world} exited with {p.returncode}:\n{logs[r].read_text()[-3000:]}"
              for r, p in enumerate(procs) if p.returncode != 0 and r not in hung]
    if failed:
        pytest.fail("\n\n".join(failed))
    if hung:
        pytest.fail(f"ranks {hung} of {world} did not finish in {TIMEOUT_S} s")
    return [torch.load(tmp / f"rank{r}.pt") for r in range(world)]


def _gather(case, ranks, name: str) -> torch.Tensor:
    dim = 1 if case.layout == "bshd" and name in ("out", "dq", "dk", "dv") else 2
    full = layout.assemble([r["results"][case.name][name] for r in ranks], seq_dim=dim, load_balance=case.load_balance)
    return full.transpose(1, 2) if dim == 1 else full


def single_process(case, world: int, q, k, v, dout, device="cpu"):
    """The single-process attngen call on the full sequence on `device`: (out, lse, dq, dk, dv) on the CPU."""
    leaves = [x.detach().to(device).requires_grad_(True) for x in (q, k, v)]
    dout = dout.to(device)
    docs = case.documents(world)
    kw = case.kwargs(world)
    if docs is None:
        out, lse = attngen.attention(*leaves, return_lse=True, **kw)
    else:
        b, s = q.shape[0], q.shape[2]
        cu = torch.tensor([0] + [i * s + d for i in range(b) for d in docs[1:]], dtype=torch.int32, device=device)
        mx = max(y - x for x, y in zip(docs, docs[1:]))
        packed = [x.permute(0, 2, 1, 3).reshape(b * s, x.shape[1], x.shape[3]) for x in leaves]
        out, lse = attngen.attention_varlen(*packed, cu, cu, mx, mx, return_lse=True, **kw)
        out = out.reshape(b, s, *out.shape[1:]).permute(0, 2, 1, 3)
        lse = lse.reshape(lse.shape[0], b, s).permute(1, 0, 2)
    out.backward(dout)
    return out.detach().cpu(), lse.cpu(), *(x.grad.cpu() for x in leaves)


def check_case(case, world: int, ranks: list, device="cpu") -> None:
    name = case.name
    q, k, v, dout = case.inputs(world)
    keep, bias = case.keep(world), case.score_bias(world)
    ref_kw = dict(softcap=case.softcap, keep=keep, bias=bias)
    ref64, lse64 = attention_ref(q, k, v, upcast=True, **ref_kw)
    ref_pt, _ = attention_ref(q, k, v, upcast=False, **ref_kw)
    out = _gather(case, ranks, "out")
    tag = f"{name}/world{world}"
    for r, res in enumerate(ranks):  # unshard(): every rank gets the whole output; positions() its tokens'
        got = res["results"][name]["unshard"]
        assert torch.equal(got.transpose(1, 2) if case.layout == "bshd" else got, out), f"{tag}: unshard on rank {r}"
        want = layout.positions(case.seqlen(world), r, world, case.load_balance)
        assert torch.equal(res["results"][name]["positions"], want), f"{tag}: positions on rank {r}"
    err, pt_err = assert_flash_rule(f"{tag}/out", out, ref64, ref_pt, 2.0)
    assert_lse_close(f"{tag}/lse", _gather(case, ranks, "lse"), lse64.float())
    one = single_process(case, world, q, k, v, dout, device)
    diff = max_err(out, one[0])
    assert diff <= 2.0 * pt_err + 1e-5, f"{tag}: |cp - single-process attngen| = {diff:.3e} > 2 x {pt_err:.3e}"
    grads = [_gather(case, ranks, n) for n in ("dq", "dk", "dv")]
    check_grads(tag, lambda q_, k_, v_, upcast: attention_ref(q_, k_, v_, upcast=upcast, **ref_kw)[0],
                (q, k, v), dout, grads, factor=3.0)
    for n, g, g1 in zip(("dq", "dk", "dv"), grads, one[2:]):
        assert torch.isfinite(g1).all(), f"{tag}: single-process {n} not finite"


def check_world(world: int, tmp: Path, device: str = "cpu") -> None:
    """Run every case of this group size in one set of workers and check each; every failing case
    is reported."""
    ranks = run_world(world, tmp, extra=("--device", device))
    failures = []
    for case in cases_for(world):
        try:
            check_case(case, world, ranks, device)
        except AssertionError as e:
            failures.append(f"{case.name}: {e}")
    assert not failures, "\n\n".join(failures)


@pytest.mark.parametrize("world", [2, 4])
def test_context_parallel_matches_one_process(world, tmp_path):
    """One test per group size (one set of workers, whichever xdist worker runs it)."""
    check_world(world, tmp_path)


def test_every_case_runs_on_some_world():
    assert {c.name for w in (2, 4) for c in cases_for(w)} == {c.name for c in CASES}


def test_a_crashing_rank_fails_fast(tmp_path):
    """Rank 1 raises before its first collective while rank 0 waits in one: the test fails at
    once with rank 1's error, not at the deadline."""
    t0 = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match="rank 1 of 2 exited with 1:(.|\n)*crash requested"):
        run_world(2, tmp_path, extra=("--crash-rank", "1"))
    assert time.monotonic() - t0 < TIMEOUT_S / 2
