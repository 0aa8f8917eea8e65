"""Uniform registers read before anything wrote them (attngen.bench.probe.undefined_uniform_reads).

ptxas 12.8.93, the one Triton 3.6 ships, compiles the fp8 prologue's rotation (a bf16 wgmma of
each 128-row block of Q / K with its 32-column Hadamard block) at 4 warps into descriptor
arithmetic that reads a uniform register no instruction wrote: the A operand's shared-memory
address is garbage, which on the H200 was a wrong Q8 / K8 (the hd96 x 40 grid case) or an
illegal address (benchmarks/results/h200_gpu_tests_fp8_warps4_fail_2026-12-04.log). The check is
a forward must-be-written analysis over the SASS's basic blocks; the first tests pin it on small
listings, the others on what ptxas makes of the prologue: the bug where it is (96 and 112
columns at 4 warps), and no undefined read at the warps the runtime launches
(fwd_fp8.quant_warps), on every qk width.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from attngen.bench.probe import undefined_uniform_reads
from attngen.env import REPO_ROOT


def listing(*lines: str) -> str:
    """A SASS function of these instructions, addressed 16 bytes apart as cuobjdump prints them."""
    return "\n        Function : k\n" + "\n".join(f"        /*{16 * i:04x}*/  {text} ;" for i, text in enumerate(lines))


def test_a_register_nothing_wrote_is_reported_and_a_written_one_is_not():
    sass = listing("UMOV UR4, 0x400", "UIADD3 UR6, UR4, 0x10, URZ", "UIADD3 UR10, UP0, UR9, 0x2, URZ", "EXIT")
    assert undefined_uniform_reads(sass) == ["0020 UIADD3 UR9"]


def test_a_write_on_one_side_of_a_branch_only_is_reported_after_the_join():
    sass = listing("@P0 BRA 0x30", "UMOV UR5, 0x1", "BRA 0x40", "UMOV UR6, 0x2",
                   "UIADD3 UR7, UR5, UR6, URZ", "EXIT")
    assert undefined_uniform_reads(sass) == ["0040 UIADD3 UR5", "0040 UIADD3 UR6"]
    both = listing("@P0 BRA 0x30", "UMOV UR5, 0x1", "BRA 0x40", "UMOV UR5, 0x2", "UIADD3 UR7, UR5, 0x1, URZ", "EXIT")
    assert undefined_uniform_reads(both) == []


def test_a_loop_keeps_what_was_written_before_it():
    sass = listing("UMOV UR4, 0x0", "UIADD3 UR4, UR4, 0x1, URZ", "UISETP.NE.AND UP0, UPT, UR4, 0x8, UPT",
                   "@UP0 BRA 0x10", "EXIT")
    assert undefined_uniform_reads(sass) == []
    late = listing("UIADD3 UR4, UR4, 0x1, URZ", "@P0 BRA 0x0", "EXIT")
    assert undefined_uniform_reads(late) == ["0000 UIADD3 UR4"]


def test_pairs_descriptors_and_predicate_outputs():
    # a .64 load writes a pair, a global access through desc[] reads one; ULOP3 with a predicate
    # output writes its second operand; a .WIDE multiply writes a pair
    ok = listing("ULDC.64 UR28, c[0x0][0x208]", "LDG.E.128 R4, desc[UR28][R2.64]",
                 "ULOP3.LUT UP0, UR5, UR28, 0x7f, URZ, 0xc0, !UPT", "UIMAD.WIDE UR6, UR5, UR5, URZ",
                 "ULEA.HI.X UR8, UR6, UR5, UR7, 0x2, UP0", "EXIT")
    assert undefined_uniform_reads(ok) == []
    half = listing("ULDC UR28, c[0x0][0x208]", "LDG.E.128 R4, desc[UR28][R2.64]", "EXIT")
    assert undefined_uniform_reads(half) == ["0010 LDG.E.128 UR29"]
    # a wgmma reads A's and B's descriptors (4 registers), only B's when A is in registers
    wgmma = listing("UMOV UR4, 0x40", "UMOV UR5, 0x40000040", "UMOV UR6, 0x440", "UMOV UR7, 0x40000040",
                    "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT", "HGMMA.64x64x16.F32.BF16 R24, R88, gdesc[UR4].tnspB, R24",
                    "HGMMA.64x64x16.F32.BF16 R24, R88, gdesc[UR8].tnspB, R24", "EXIT")
    assert undefined_uniform_reads(wgmma) == ["0060 HGMMA.64x64x16.F32.BF16 UR10", "0060 HGMMA.64x64x16.F32.BF16 UR11"]


def test_a_copy_is_not_a_use_and_a_copy_of_nothing_writes_nothing():
    # ptxas parks uniform registers in regular ones around a wgmma's descriptor set-up (MOV, then
    # R2UR back): a copy of a register not written yet is no read of it; but what a UMOV copies
    # from an unwritten register is unwritten too
    parked = listing("MOV R23, UR23", "UMOV UR23, 0x40", "UIADD3 UR24, UR23, 0x2, URZ", "R2UR UR23, R23", "EXIT")
    assert undefined_uniform_reads(parked) == []
    copied = listing("UMOV UR5, UR9", "UIADD3 UR6, UR5, 0x2, URZ", "EXIT")
    assert undefined_uniform_reads(copied) == ["0010 UIADD3 UR5"]
    # IMAD is a copy only as IMAD.MOV.U32 R, RZ, RZ, UR; a multiply by a uniform register is a use
    mul = listing("IMAD.MOV.U32 R4, RZ, RZ, UR9", "IMAD.U32 R5, R2, UR9, R3", "EXIT")
    assert undefined_uniform_reads(mul) == ["0010 IMAD.U32 UR9"]


def test_blocks_behind_an_indirect_branch_start_from_the_dispatch():
    # a warp-specialized kernel's partitions are reached through BRX (a table): what was written
    # before the dispatch holds in them, and a register the dispatch did not write does not
    sass = listing("R2UR UR23, R2", "BRX R4 -0x20", "UIADD3 UR5, UR23, 0x1, URZ", "EXIT",
                   "UIADD3 UR6, UR24, 0x1, URZ", "EXIT")
    assert undefined_uniform_reads(sass) == ["0040 UIADD3 UR24"]


SCRIPT = """
import json, os, sys, tempfile
from pathlib import Path
os.environ["TRITON_INTERPRET"] = "0"
import torch
from attngen.bench.probe import probe
from attngen.families import fwd_fp8
from attngen.runtime import loader
from attngen.spec import KernelSpec
out = {}
tmp = Path(tempfile.mkdtemp())
for item in json.loads(sys.argv[1]):
    width, warps = item
    spec = KernelSpec("fwd_fp8", "fp8_e4m3", "sm90", width, width, 3, "causal")
    mod = loader.load(spec)
    q = torch.empty(2, 6, 203, width, dtype=torch.bfloat16)
    k, v = (torch.empty(2, 2, 1023, width, dtype=torch.bfloat16) for _ in range(2))
    bufs = fwd_fp8.alloc(fwd_fp8.buffers(spec, q, k, v, False), q.device)
    rot = fwd_fp8.rotation(fwd_fp8.qk_width(spec), fwd_fp8.ROTATION_SEED, q.dtype, q.device)
    la = fwd_fp8.prologue_launch(mod, spec, q, k, v, bufs, rot, perm16=True, use_pdl=True)
    la.num_warps = warps or la.num_warps
    rep = probe(la, tmp, None, "p")
    out[f"{width}x{la.num_warps}"] = rep["undefined_uniform_reads"]
print(json.dumps(out))
"""


def prologue_reads(items: list[tuple[int, int]]) -> dict[str, list[str]]:
    """The runtime's one-launch prologue (_fp8_quant_qkv, Q rotated) compiled for sm90 for each
    (qk width, warps; 0: fwd_fp8.quant_warps), its undefined uniform reads by 'WIDTHxWARPS'."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    res = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(items)], capture_output=True, text=True,
                         env=env, cwd=REPO_ROOT, timeout=900)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_ptxas_reads_an_undefined_register_in_the_prologue_at_4_warps_and_not_at_the_shipped_warps():
    """The compiler bug the prologue's warps rule avoids: at 4 warps the 64 + 32 (+ 16) column
    blocks of hd96 / hd112 compile to wgmma descriptors built from a register nothing wrote (in
    the Q and the K part of the launch); one Hadamard block (hd64, hd128) and 64 + 16 (hd80) at 4
    warps, and hd96 / hd112 at 8, do not. If a Triton upgrade brings a ptxas without the bug,
    this test fails and the rule (fwd_fp8.quant_warps) can be measured again."""
    got = prologue_reads([(96, 4), (112, 4), (64, 4), (80, 4), (128, 4), (96, 8), (112, 8)])
    assert len(got["96x4"]) >= 2 and len(got["112x4"]) >= 2, got
    assert all(r.split()[1].startswith("UIADD3") for r in got["96x4"] + got["112x4"]), got
    assert got["64x4"] == got["80x4"] == got["128x4"] == got["96x8"] == got["112x8"] == [], got


def test_the_prologue_at_its_launch_warps_reads_no_undefined_register_at_any_width():
    from attngen.families.fwd_fp8 import quant_warps

    widths = list(range(16, 257, 16))
    got = prologue_reads([(w, 0) for w in widths])
    assert sorted(got) == sorted(f"{w}x{quant_warps(w)}" for w in widths), got
    assert {k: v for k, v in got.items() if v} == {}, got
