"""The sm90 kernels compiled for the GPU on a CPU machine (benchmarks/compile_probe.py: Triton's own
ptxas, no GPU): what a register knob is for is visible in the compiled code, so a template or
Triton change that silently undoes it fails here, not only as a slower benchmark."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from attngen.env import REPO_ROOT

PROBE = REPO_ROOT / "benchmarks" / "compile_probe.py"


def probe(*args: str) -> list[dict]:
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    res = subprocess.run([sys.executable, str(PROBE), *args, "--json"], capture_output=True, text=True,
                         env=env, cwd=REPO_ROOT, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("fam, config, kernel", [
    ("fwd", "64,64,4,3", "_attn_fwd_tma"),
    ("bwd", "64,64,4,2,128,64,8,3", "_attn_bwd_dq_tma"),
])
def test_operands_in_registers_leave_shared_memory(fam, config, kernel):
    """q_regs (forward) / dq_regs (dQ pass): Q.K^T's wgmma (m64n64k16 here: 64 keys per block)
    reads its A operand from registers instead of shared memory, and the kernel needs less shared
    memory; nothing spills."""
    knob = "q_regs" if fam == "fwd" else "dq_regs"
    off, on = ([r for r in probe(fam, "--hd", "128", "--mask", "causal", "--config", config, *extra)
                if r["kernel"] == kernel][0]
               for extra in ((), ("--also", f"{knob}=True")))
    assert "m64n64k16 A from shared" in off["wgmma"], off
    assert "m64n64k16 A from registers" in on["wgmma"] and "m64n64k16 A from shared" not in on["wgmma"], on
    assert on["shared_bytes"] < off["shared_bytes"], (on, off)
    assert on["registers"] > off["registers"] and on["spill_stores"] == 0, (on, off)
