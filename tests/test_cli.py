"""`attngen build` as a user runs it: exit codes, what it prints, and what it writes (or not)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attngen.cli import main
from attngen.env import REPO_ROOT

SPEC_A = """\
model: test-a
kernels:
  - name: a_causal
    head_dim: 64
    gqa_ratio: 2
    mask: causal
    dtypes: [fp16, bf16]
    targets: sm80
    families: fwd
"""
A_URIS = {"attn_fwd_fp16_hd64_gqa2_causal_sm80", "attn_fwd_bf16_hd64_gqa2_causal_sm80"}

SPEC_B = """\
model: test-b
kernels:
  - name: b_swa
    head_dim: 96
    gqa_ratio: 1
    mask: sliding_window
    window: 128
    dtypes: fp16
    targets: sm90
    families: fwd
"""
B_URI = "attn_fwd_fp16_hd96_gqa1_swa_sm90"

BAD = """\
kernels:
  - name: ok
    head_dim: 64
    gqa_ratio: 1
    mask: none
    dtypes: fp16
    targets: sm80
    families: fwd
  - name: broken
    head_dim: 100
    gqa_ratio: 1
    mask: none
    dtypes: fp16
    targets: sm80
"""


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (relative name -> bytes); {} when the folder does not exist."""
    if not folder.exists():
        return {}
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def kernel_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("attn_*.py"))


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.fixture
def spec_a(tmp_path) -> Path:
    path = tmp_path / "a.yaml"
    path.write_text(SPEC_A)
    return path


def test_build_writes_files_and_prints_them(tmp_path, spec_a, capsys):
    out = tmp_path / "gen"
    rc, stdout, stderr = run(capsys, "build", spec_a, "--out", out)
    assert rc == 0, stderr
    files = kernel_files(out)
    assert sorted(f.rsplit("_", 1)[0] for f in files) == sorted(A_URIS)
    assert (out / "manifest.json").is_file()
    for name in [*files, "manifest.json"]:
        assert f"wrote   {out}/{name}" in stdout, stdout
    assert "3 written, 0 unchanged, 0 removed" in stdout
    manifest = json.loads((out / "manifest.json").read_text())["kernels"]
    assert set(manifest) == A_URIS
    assert {ent["file"] for ent in manifest.values()} == set(files)


def test_second_build_writes_nothing(tmp_path, spec_a, capsys):
    out = tmp_path / "gen"
    assert run(capsys, "build", spec_a, "--out", out)[0] == 0
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    rc, stdout, _ = run(capsys, "build", spec_a, "--out", out)
    assert rc == 0
    assert "0 written, 3 unchanged, 0 removed" in stdout
    assert "wrote" not in stdout
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before


def test_check(tmp_path, spec_a, capsys):
    out = tmp_path / "gen"
    # nothing built yet: stale, and --check creates nothing
    rc, stdout, _ = run(capsys, "build", spec_a, "--out", out, "--check")
    assert rc == 1 and not out.exists()
    assert "(would be written)" in stdout

    assert run(capsys, "build", spec_a, "--out", out)[0] == 0
    rc, stdout, _ = run(capsys, "build", spec_a, "--out", out, "--check")
    assert rc == 0, stdout
    assert "is up to date (3 files)" in stdout

    snapshot = tree(out)
    victim = kernel_files(out)[0]

    # a deleted file
    (out / victim).unlink()
    rc, stdout, stderr = run(capsys, "build", spec_a, "--out", out, "--check")
    assert rc == 1
    assert f"stale: {out}/{victim} (would be written)" in stdout
    assert "out of date" in stderr
    assert (out / victim).exists() is False, "--check must not write"
    (out / victim).write_bytes(snapshot[victim])
    assert run(capsys, "build", spec_a, "--out", out, "--check")[0] == 0

    # a hand-edited file
    (out / victim).write_text(snapshot[victim].decode() + "# edited\n")
    rc, stdout, _ = run(capsys, "build", spec_a, "--out", out, "--check")
    assert rc == 1 and victim in stdout
    assert (out / victim).read_text().endswith("# edited\n"), "--check must not write"
    (out / victim).write_bytes(snapshot[victim])

    # a hand-edited manifest
    (out / "manifest.json").write_text("{}\n")
    assert run(capsys, "build", spec_a, "--out", out, "--check")[0] == 1
    (out / "manifest.json").write_bytes(snapshot["manifest.json"])
    assert run(capsys, "build", spec_a, "--out", out, "--check")[0] == 0

    # a changed spec (even a comment: the header stamps the spec file's hash)
    spec_a.write_text("# a comment\n" + SPEC_A)
    rc, stdout, _ = run(capsys, "build", spec_a, "--out", out, "--check")
    assert rc == 1
    assert stdout.count("(would be written)") == 3
    assert stdout.count("(would be removed)") == 2  # the older builds of the same uris
    assert tree(out) == snapshot, "--check must not write"
    assert run(capsys, "build", spec_a, "--out", out)[0] == 0
    assert run(capsys, "build", spec_a, "--out", out, "--check")[0] == 0
    assert len(kernel_files(out)) == 2


def test_bad_spec_returns_2_and_writes_nothing(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD)
    out = tmp_path / "gen"
    rc, stdout, stderr = run(capsys, "build", bad, "--out", out)
    assert rc == 2
    assert f"{bad}: kernel 'broken' (entry 1): field 'head_dim': must be a multiple of 8" in stderr
    assert "nothing written" in stderr
    assert "Traceback" not in stderr + stdout
    assert not out.exists()


def test_folder_with_one_good_and_one_bad_spec_writes_nothing(tmp_path, spec_a, capsys):
    folder = tmp_path / "specs"
    folder.mkdir()
    (folder / "a.yaml").write_text(SPEC_A)  # sorts first: a build that wrote as it went would write it
    (folder / "z.yaml").write_text(BAD)
    out = tmp_path / "gen"
    rc, _, stderr = run(capsys, "build", folder, "--out", out)
    assert rc == 2 and not out.exists()
    assert f"{folder / 'z.yaml'}: kernel 'broken' (entry 1): field 'head_dim'" in stderr

    # an existing output folder stays exactly as it was
    assert run(capsys, "build", spec_a, "--out", out)[0] == 0
    snapshot = tree(out)
    (folder / "b.yaml").write_text(SPEC_B)
    for argv in (["build", folder, "--out", out], ["build", folder, "--out", out, "--check"],
                 ["build", folder / "b.yaml", folder / "z.yaml", "--out", out]):
        rc, stdout, stderr = run(capsys, *argv)
        assert rc == 2, argv
        assert "Traceback" not in stderr and "field 'head_dim'" in stderr
        assert tree(out) == snapshot, f"{argv} touched the output folder"


def test_unimplemented_dtype_returns_2_and_writes_nothing(tmp_path, capsys):
    spec = tmp_path / "fp8.yaml"
    spec.write_text(SPEC_A.replace("[fp16, bf16]", "[fp16, fp8_e4m3]").replace("sm80", "sm90"))
    out = tmp_path / "gen"
    rc, _, stderr = run(capsys, "build", spec, "--out", out)
    assert rc == 2 and not out.exists()
    assert "attn_fwd_fp8_e4m3_hd64_gqa2_causal_sm90: fp8_e4m3 kernels are not implemented yet" in stderr


def test_missing_spec_path_returns_2(tmp_path, capsys):
    rc, _, stderr = run(capsys, "build", tmp_path / "nope.yaml", "--out", tmp_path / "gen")
    assert rc == 2 and "no such spec file or folder" in stderr
    assert not (tmp_path / "gen").exists()


def test_folder_build_prunes_stale_files(tmp_path, capsys):
    folder = tmp_path / "specs"
    folder.mkdir()
    (folder / "a.yaml").write_text(SPEC_A)
    (folder / "b.yaml").write_text(SPEC_B)
    out = tmp_path / "gen"
    assert run(capsys, "build", folder, "--out", out)[0] == 0
    assert len(kernel_files(out)) == 3
    b_file = next(f for f in kernel_files(out) if f.startswith(B_URI))
    (out / "notes.txt").write_text("not a kernel: never pruned\n")

    # a single-file build only adds: b's kernel stays
    (folder / "b.yaml").unlink()
    rc, stdout, _ = run(capsys, "build", folder / "a.yaml", "--out", out)
    assert rc == 0 and "0 removed" in stdout
    assert b_file in kernel_files(out)
    assert B_URI in json.loads((out / "manifest.json").read_text())["kernels"]

    # the folder build removes it, and says so
    rc, stdout, _ = run(capsys, "build", folder, "--out", out, "--check")
    assert rc == 1 and f"stale: {out}/{b_file} (would be removed)" in stdout
    rc, stdout, _ = run(capsys, "build", folder, "--out", out)
    assert rc == 0
    assert f"removed {out}/{b_file}" in stdout
    assert "1 written, 2 unchanged, 1 removed" in stdout  # the manifest, a's two kernels, b's kernel
    assert sorted(f.rsplit("_", 1)[0] for f in kernel_files(out)) == sorted(A_URIS)
    assert set(json.loads((out / "manifest.json").read_text())["kernels"]) == A_URIS
    assert (out / "notes.txt").exists()
    assert run(capsys, "build", folder, "--out", out, "--check")[0] == 0


def test_module_entry_point_in_a_subprocess(tmp_path, spec_a):
    """`python3 -m attngen.cli` exits with main()'s code; a bad spec gives no traceback. (One run:
    each one pays for importing torch.)"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                                      os.environ.get("PYTHONPATH")]))}
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD)
    out = tmp_path / "gen"
    cmd = [sys.executable, "-m", "attngen.cli", "build", str(spec_a), str(bad), "--out", str(out)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert f"{bad}: kernel 'broken' (entry 1): field 'head_dim'" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists()


def test_default_targets_are_the_repository_specs(tmp_path, monkeypatch, capsys):
    """With no spec arguments, `build` pairs the repository's specs/ with its generated/, whatever
    the current directory holds (a stray specs/ there must not prune the repository's kernels)."""
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "a.yaml").write_text(SPEC_A)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ATTNGEN_GENERATED_DIR", raising=False)
    rc, stdout, stderr = run(capsys, "build", "--check")  # --check: never writes
    assert rc == 0, f"repository generated/ looks stale from elsewhere:\n{stdout}{stderr}"
    assert "is up to date" in stdout
