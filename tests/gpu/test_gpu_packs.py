"""GPU: a compiled-kernel pack made by `attngen warmup SPEC --backward --pack FILE` for one small
spec, then the same forward and backward call in two fresh processes with empty Triton caches:
one compiles (the probe must see it: Triton compiles, ptxas, the C compiler), the other loads the
pack through ATTNGEN_PACKS and must compile nothing (no Triton compile, no ptxas run, no C
compiler run; attngen.bench.startup counts them, subprocesses included) and give the same bits.
The CPU side of packs: tests/runtime/test_packs.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from attngen.env import REPO_ROOT

pytestmark = pytest.mark.gpu

SPEC = """\
kernels:
  - name: packed_small
    head_dim: 64
    num_q_heads: 4
    num_kv_heads: 2
    mask: causal
    dtypes: bf16
    targets: [sm80, sm90]
    families: [fwd, bwd]
"""
SEQLEN = 2048  # B1 H4 S2048: past the host-bound bucket, so the sm90 TMA kernels serve

CALL = textwrap.dedent(f"""
    import json, sys, torch
    from attngen.bench.startup import StartupProbe, compiled_anything
    probe = StartupProbe().install()
    import attngen
    from attngen.runtime import packs
    hq, hkv, s, d = map(int, sys.argv[2:6])
    torch.manual_seed(0)
    q = torch.randn(1, hq, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(1, hkv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for _ in range(2))
    with probe.phase("forward"):
        out = attngen.attention(q, k, v, causal=True)
        torch.cuda.synchronize()
    with probe.phase("backward"):
        out.float().square().sum().backward()
        torch.cuda.synchronize()
    probe.uninstall()
    torch.save({{"out": out.detach().cpu(), "dq": q.grad.cpu(), "dk": k.grad.cpu(), "dv": v.grad.cpu()}},
               sys.argv[1])
    ph = probe.summary()
    print(json.dumps({{"phases": ph, "compiled": {{p: compiled_anything(ph[p]) for p in ("forward", "backward")}},
                      "packs": [r.as_dict() for r in packs.loaded()]}}))
""")


def _python(args, tmp_path, **extra) -> subprocess.CompletedProcess:
    # the packs shipped in attngen/packs/ only where a test asks for them
    environ = {**os.environ, "ATTNGEN_CACHE_DIR": str(tmp_path / "attngen_cache"), "ATTNGEN_SHIPPED_PACKS": "0",
               **extra}
    environ.pop("TRITON_INTERPRET", None)
    if "ATTNGEN_PACKS" not in extra:
        environ.pop("ATTNGEN_PACKS", None)
    res = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=environ, cwd=REPO_ROOT,
                         timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-4000:]
    return res


def _call(tmp_path, name: str, shape=(4, 2, SEQLEN, 64), **extra) -> tuple[dict, dict]:
    cache = tmp_path / f"triton_{name}"
    cache.mkdir()
    res = _python(["-c", CALL, str(tmp_path / f"{name}.pt"), *map(str, shape)], tmp_path,
                  TRITON_CACHE_DIR=str(cache), **extra)
    return json.loads(res.stdout.strip().splitlines()[-1]), torch.load(tmp_path / f"{name}.pt")


def test_a_packed_process_compiles_nothing_and_matches_bitwise(tmp_path):
    (tmp_path / "small.yaml").write_text(SPEC)
    pack = tmp_path / "small.pack"
    warm = _python(["-c", "import sys; from attngen.cli import main; sys.exit(main(sys.argv[1:]))", "warmup",
                    str(tmp_path / "small.yaml"), "--seqlens", str(SEQLEN), "--backward", "--pack", str(pack)],
                   tmp_path, TRITON_CACHE_DIR=str(tmp_path / "triton_warmup"))
    assert pack.exists() and "kernels" in warm.stdout, warm.stdout
    cold, ref = _call(tmp_path, "cold")
    packed, got = _call(tmp_path, "packed", ATTNGEN_PACKS=str(pack))
    assert cold["compiled"]["forward"] and cold["compiled"]["backward"], cold  # the probe sees compiles
    (report,) = packed["packs"]
    assert report["error"] is None and report["taken"] and not report["skipped"], report
    assert packed["compiled"] == {"forward": [], "backward": []}, packed["phases"]
    for phase in ("forward", "backward"):
        assert packed["phases"][phase].get("cache_hits", 0) >= 1, packed["phases"][phase]
    for name in ("out", "dq", "dk", "dv"):
        assert torch.equal(ref[name], got[name]), f"{name}: the packed run differs from the compiled one"


def test_the_shipped_pack_serves_llama_without_compiling(tmp_path):
    """attngen/packs/sm90_llama.pack (attngen warmup specs/llama.yaml --backward): a fresh process
    with empty caches and no ATTNGEN_PACKS runs Llama-3-8B's causal bf16 forward and backward at a
    warmed bucket (4096) without compiling, and as a process that compiled them."""
    from attngen import env

    if not env.shipped_packs():
        pytest.skip("no pack shipped in attngen/packs/")
    shape = (32, 8, 4096, 128)
    cold, ref = _call(tmp_path, "cold", shape)
    shipped, got = _call(tmp_path, "shipped", shape, ATTNGEN_SHIPPED_PACKS="1")
    assert cold["compiled"]["forward"] and cold["compiled"]["backward"], cold
    reports = [r for r in shipped["packs"] if r["path"].endswith("sm90_llama.pack")]
    assert len(reports) == 1 and reports[0]["error"] is None and reports[0]["taken"], shipped["packs"]
    assert shipped["compiled"] == {"forward": [], "backward": []}, shipped["phases"]
    for name in ("out", "dq", "dk", "dv"):
        assert torch.equal(ref[name], got[name]), f"{name}: the shipped pack's run differs from a compiled one"
