"""`attngen build` as a user runs it: exit codes, what it prints, and what it writes (or not)."""

from __future__ import annotations

import json
import os
import shutil
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
    head_dim: 300
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
    assert stdout.count("(would be removed: older build of attn_fwd_") == 2  # replaced by the new ones
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
    assert f"{bad}: kernel 'broken' (entry 1): field 'head_dim': must be in [8, 256], got 300" in stderr
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


def test_fp8_with_a_backward_is_a_spec_error_naming_file_entry_and_field(tmp_path, capsys):
    spec = tmp_path / "fp8.yaml"
    spec.write_text(SPEC_A.replace("[fp16, bf16]", "[fp16, fp8_e4m3]").replace("sm80", "sm90")
                    .replace("families: fwd", "families: [fwd, bwd]"))
    out = tmp_path / "gen"
    rc, stdout, stderr = run(capsys, "build", spec, "--out", out)
    assert rc == 2 and not out.exists()
    assert stderr.splitlines() == [
        "attngen build: 1 problem(s), nothing written:",
        f"{spec}: kernel 'a_causal' (entry 0): field 'families': bwd: fp8_e4m3 kernels are forward-only "
        "(inference); give fp8_e4m3 an entry of its own with families: fwd (or leave families out)"]
    assert stdout == ""


def test_fp8_entry_builds_the_fp8_forward(tmp_path, capsys):
    spec = tmp_path / "fp8.yaml"
    spec.write_text(SPEC_A.replace("[fp16, bf16]", "[fp16, fp8_e4m3]").replace("sm80", "sm90"))
    out = tmp_path / "gen"
    rc, stdout, stderr = run(capsys, "build", spec, "--out", out)
    assert rc == 0, stderr
    assert sorted(p.name.rsplit("_", 1)[0] for p in out.glob("attn_*.py")) == [
        "attn_fwd_fp16_hd64_gqa2_causal_sm90", "attn_fwd_fp8_e4m3_hd64_gqa2_causal_sm90"]


def test_every_problem_of_every_file_at_once(tmp_path, capsys):
    """Two bad files and a duplicate name across files: every problem, one exit, nothing written."""
    folder = tmp_path / "specs"
    folder.mkdir()
    (folder / "a.yaml").write_text(SPEC_A.replace("head_dim: 64", "head_dim: 300"))
    (folder / "b.yaml").write_text(SPEC_B.replace("b_swa", "a_causal").replace("    window: 128\n", ""))
    (folder / "c.yaml").write_text(BAD.replace("dtypes: fp16\n    targets: sm80\n    families: fwd",
                                               "dtypes: fp8_e4m3\n    targets: sm90\n    families: bwd"))
    out = tmp_path / "gen"
    rc, stdout, stderr = run(capsys, "build", folder, "--out", out)
    assert rc == 2 and not out.exists() and stdout == ""
    assert "Traceback" not in stderr
    a, b, c = (folder / n for n in ("a.yaml", "b.yaml", "c.yaml"))
    assert stderr.splitlines() == [
        "attngen build: 5 problem(s), nothing written:",
        f"{a}: kernel 'a_causal' (entry 0): field 'head_dim': must be in [8, 256], got 300",
        f"{b}: kernel 'a_causal' (entry 0): field 'window': is required for a sliding-window mask",
        f"{b}: kernel 'a_causal' (entry 0): field 'name': also used by {a} (entry 0); entry names "
        "must be unique across the spec files of one build",
        f"{c}: kernel 'ok' (entry 0): field 'families': bwd: fp8_e4m3 kernels are forward-only (inference); "
        "give fp8_e4m3 an entry of its own with families: fwd (or leave families out)",
        f"{c}: kernel 'broken' (entry 1): field 'head_dim': must be in [8, 256], got 300",
    ]


def test_missing_spec_path_returns_2(tmp_path, capsys):
    rc, _, stderr = run(capsys, "build", tmp_path / "nope.yaml", "--out", tmp_path / "gen")
    assert rc == 2 and "no such spec file or folder" in stderr
    assert not (tmp_path / "gen").exists()


def test_folder_build_removes_kernels_of_its_own_specs_only(tmp_path, capsys):
    folder = tmp_path / "specs"
    folder.mkdir()
    (folder / "a.yaml").write_text(SPEC_A)
    (folder / "b.yaml").write_text(SPEC_B)
    out = tmp_path / "gen"
    assert run(capsys, "build", folder, "--out", out)[0] == 0
    assert len(kernel_files(out)) == 3
    b_file = next(f for f in kernel_files(out) if f.startswith(B_URI))
    (out / "notes.txt").write_text("not a kernel: never pruned\n")

    # a single-file build only adds: b's kernel stays, and says so
    (folder / "b.yaml").unlink()
    rc, stdout, _ = run(capsys, "build", folder / "a.yaml", "--out", out)
    assert rc == 0 and "0 written, 3 unchanged, 0 removed, 1 kept (from spec files not in this build)" in stdout
    assert b_file in kernel_files(out)
    assert B_URI in json.loads((out / "manifest.json").read_text())["kernels"]

    # the folder build removes it (b.yaml was in that folder), and says why
    rc, stdout, _ = run(capsys, "build", folder, "--out", out, "--check")
    assert rc == 1
    assert f"stale: {out}/{b_file} (would be removed: no longer asked for by specs/b.yaml)" in stdout
    rc, stdout, _ = run(capsys, "build", folder, "--out", out)
    assert rc == 0
    assert f"removed {out}/{b_file} (no longer asked for by specs/b.yaml)" in stdout
    assert "1 written, 2 unchanged, 1 removed\n" in stdout  # the manifest, a's two kernels, b's kernel
    assert sorted(f.rsplit("_", 1)[0] for f in kernel_files(out)) == sorted(A_URIS)
    assert set(json.loads((out / "manifest.json").read_text())["kernels"]) == A_URIS
    assert (out / "notes.txt").exists()
    assert run(capsys, "build", folder, "--out", out, "--check")[0] == 0


@pytest.fixture
def shipped(tmp_path) -> Path:
    """A copy of the committed generated/ (what a fresh clone has), to build into."""
    out = tmp_path / "generated"
    shutil.copytree(REPO_ROOT / "generated", out)
    return out


def test_building_another_folder_never_removes_the_shipped_kernels(tmp_path, shipped, capsys):
    """The issue: `attngen build myspecs/` (one spec) printed `2 written, 0 unchanged, 52 removed`."""
    before = tree(shipped)
    shipped_kernels = kernel_files(shipped)
    myspecs = tmp_path / "myspecs"
    myspecs.mkdir()
    (myspecs / "a.yaml").write_text(SPEC_A)
    rc, stdout, _ = run(capsys, "build", myspecs, "--out", shipped)
    assert rc == 0, stdout
    assert (f"3 written, 0 unchanged, 0 removed, {len(shipped_kernels)} kept "
            "(from spec files not in this build)") in stdout
    after = tree(shipped)
    assert {n: b for n, b in after.items() if n in before and n != "manifest.json"} == {
        n: b for n, b in before.items() if n != "manifest.json"}, "a shipped kernel changed or went"
    manifest = json.loads(after["manifest.json"])["kernels"]
    assert set(manifest) == set(json.loads(before["manifest.json"])["kernels"]) | A_URIS
    # the repository's own build of specs/ still sees generated/ as up to date, apart from a's
    # kernels, which it leaves alone too
    rc, stdout, _ = run(capsys, "build", REPO_ROOT / "specs", "--out", shipped, "--check")
    assert rc == 0, stdout
    # --prune asks for it: then the other kernels go, each one said
    rc, stdout, _ = run(capsys, "build", myspecs, "--out", shipped, "--prune")
    assert rc == 0
    assert f"1 written, 2 unchanged, {len(shipped_kernels)} removed\n" in stdout  # + the manifest
    for f in shipped_kernels:
        assert f"removed {shipped}/{f} (--prune: not made by this build)" in stdout
    assert sorted(f.rsplit("_", 1)[0] for f in kernel_files(shipped)) == sorted(A_URIS)


def test_building_the_specs_folder_removes_its_stale_kernels(tmp_path, shipped, capsys):
    """A copy of the repository's specs/ without phi3.yaml: exactly phi3's kernels go (as the
    committed manifest records them), every other file stays byte for byte."""
    specs = tmp_path / "specs"
    shutil.copytree(REPO_ROOT / "specs", specs)
    (specs / "phi3.yaml").unlink()
    before = tree(shipped)
    manifest = json.loads(before["manifest.json"])["kernels"]
    phi3 = sorted(ent["file"] for ent in manifest.values()
                  if all(s.startswith("specs/phi3.yaml#") for s in ent["sources"]))
    assert phi3, "phi3.yaml makes no kernel of its own any more: pick another spec file"
    rc, stdout, _ = run(capsys, "build", specs, "--out", shipped)
    assert rc == 0, stdout
    assert f"1 written, {len(manifest) - len(phi3)} unchanged, {len(phi3)} removed\n" in stdout
    for f in phi3:
        assert f"removed {shipped}/{f} (no longer asked for by specs/phi3.yaml)" in stdout
    after = tree(shipped)
    assert set(before) - set(after) == set(phi3)
    assert all(after[n] == before[n] for n in after if n != "manifest.json")


def test_a_kernel_asked_for_from_two_folders_lists_both_and_survives_either(tmp_path, capsys):
    folder, mine = tmp_path / "specs", tmp_path / "myspecs"
    folder.mkdir()
    mine.mkdir()
    (folder / "a.yaml").write_text(SPEC_A)
    out = tmp_path / "gen"
    assert run(capsys, "build", folder, "--out", out)[0] == 0
    alone = tree(out)
    # myspecs/m.yaml asks for one of a's kernels (and its own one)
    (mine / "m.yaml").write_text(SPEC_A.replace("a_causal", "mine").replace("[fp16, bf16]", "fp16")
                                 + SPEC_B.split("kernels:\n")[1])
    rc, stdout, _ = run(capsys, "build", mine, "--out", out)
    assert rc == 0, stdout
    assert "3 written, 0 unchanged, 1 removed, 1 kept" in stdout  # fp16 (re-stamped), b's, manifest
    fp16 = "attn_fwd_fp16_hd64_gqa2_causal_sm80"
    (shared,) = [f for f in kernel_files(out) if f.startswith(fp16)]
    spec_lines = [ln for ln in (out / shared).read_text().splitlines() if ln.startswith("# spec:")]
    assert [ln.split()[2] for ln in spec_lines] == ["myspecs/m.yaml#mine", "specs/a.yaml#a_causal"]
    # the specs/ folder's own build keeps myspecs' source (and so is up to date)
    assert run(capsys, "build", folder, "--out", out, "--check")[0] == 0
    # myspecs stops asking: the kernel goes back to exactly what specs/ alone made
    (mine / "m.yaml").write_text("kernels:\n" + SPEC_B.split("kernels:\n")[1])
    rc, stdout, _ = run(capsys, "build", mine, "--out", out)
    assert rc == 0, stdout
    (fp16_file,) = [f for f in kernel_files(out) if f.startswith(fp16)]
    assert (out / fp16_file).read_bytes() == alone[fp16_file]
    # myspecs/ without m.yaml: b's kernel (asked for by myspecs/m.yaml only) goes; specs/' stay
    b_file = next(f for f in kernel_files(out) if f.startswith(B_URI))
    (mine / "m.yaml").unlink()
    (mine / "other.yaml").write_text(SPEC_A.replace("a_causal", "x").replace("head_dim: 64", "head_dim: 128"))
    rc, stdout, _ = run(capsys, "build", mine, "--out", out)
    assert rc == 0, stdout
    assert f"removed {out}/{b_file} (no longer asked for by myspecs/m.yaml)" in stdout
    now = tree(out)
    assert {n: now[n] for n in alone if n != "manifest.json"} == {
        n: b for n, b in alone.items() if n != "manifest.json"}
    assert {f.rsplit("_", 1)[0] for f in set(now) - set(alone)} == {
        "attn_fwd_fp16_hd128_gqa2_causal_sm80", "attn_fwd_bf16_hd128_gqa2_causal_sm80"}


def test_unreadable_manifest_stops_the_build(tmp_path, spec_a, capsys):
    out = tmp_path / "gen"
    assert run(capsys, "build", spec_a, "--out", out)[0] == 0
    (out / "manifest.json").write_text("{not json")
    snapshot = tree(out)
    rc, _, stderr = run(capsys, "build", spec_a, "--out", out)
    assert rc == 2 and f"{out / 'manifest.json'}: not a manifest attngen can read" in stderr
    assert "--prune" in stderr and tree(out) == snapshot
    rc, stdout, _ = run(capsys, "build", spec_a, "--out", out, "--prune")
    assert rc == 0 and "1 written, 2 unchanged, 0 removed" in stdout


def test_module_entry_point_in_a_subprocess(tmp_path, spec_a):
    """`python3 -m attngen.cli` exits with main()'s code: a bad spec gives 2 and no traceback, no
    arguments give the usage and 0. (Two runs: each one pays for importing torch.)"""
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
    proc = subprocess.run(cmd[:3], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr
    assert proc.stdout.startswith("usage: attngen ") and "build" in proc.stdout


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


# ---- an installed (non-editable) attngen: read-only package, builds go to the user cache --------


@pytest.fixture
def installed(tmp_path, monkeypatch) -> Path:
    """attngen as a wheel install sees itself: not a checkout; the user cache under tmp_path.
    Returns where builds go by default."""
    from attngen import env

    monkeypatch.setattr(env, "in_checkout", lambda: False)
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ATTNGEN_GENERATED_DIR", raising=False)
    return tmp_path / "cache" / "generated"


def test_installed_build_without_arguments_says_what_to_do(installed, tmp_path, capsys):
    for argv in (["build", "--check"], ["build"]):
        rc, stdout, stderr = run(capsys, *argv)
        assert rc == 2, argv
        assert "name the spec files or folders to build" in stderr
        assert "installed package, not a source checkout" in stderr
        assert "no such spec file" not in stderr and "Traceback" not in stderr
    assert not (tmp_path / "cache").exists()


def test_installed_build_writes_the_user_cache_with_the_shipped_bytes(installed, tmp_path, monkeypatch,
                                                                       capsys):
    """`attngen build <clone>/specs/llama.yaml` from a wheel install: nothing in the repository's
    (or the package's) generated/ changes, the kernels land in the user cache, and they are byte for
    byte the committed ones (no machine path in a stamp), whether the path is relative or absolute."""
    committed = tree(REPO_ROOT / "generated")
    clone = tmp_path / "clone"
    (clone / "specs").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "specs" / "llama.yaml", clone / "specs" / "llama.yaml")
    monkeypatch.chdir(tmp_path)  # the cache is under it: shown relative, but the hint is absolute
    rc, stdout, stderr = run(capsys, "build", "clone/specs/llama.yaml")
    assert rc == 0, stderr
    built = kernel_files(installed)
    assert built and f"{len(built) + 1} written, 0 unchanged, 0 removed" in stdout
    assert f"wrote   cache/generated/{built[0]}" in stdout
    assert "ATTNGEN_GENERATED_DIR" not in stdout  # nothing to set: the runtime looks there
    from attngen.runtime import loader
    from attngen.spec import load_spec

    spec = load_spec(clone / "specs" / "llama.yaml").entries[0].kernel_specs()[0]
    assert loader.built_module_path(spec).parent == installed
    for name in built:
        assert committed.get(name) == (installed / name).read_bytes(), f"{name} differs from generated/"
    llama = {u for u, e in json.loads(committed["manifest.json"])["kernels"].items()
             if any(s.startswith("specs/llama.yaml#") for s in e["sources"])}
    assert {f.rsplit("_", 1)[0] for f in built} == llama
    monkeypatch.chdir(clone / "specs")
    rc, stdout, _ = run(capsys, "build", clone / "specs" / "llama.yaml")  # absolute path: same bytes
    assert rc == 0 and f"0 written, {len(built) + 1} unchanged, 0 removed" in stdout
    assert tree(REPO_ROOT / "generated") == committed


def test_a_build_elsewhere_says_how_the_runtime_finds_it(tmp_path, spec_a, capsys):
    rc, stdout, _ = run(capsys, "build", spec_a, "--out", tmp_path / "mine")
    assert rc == 0
    assert f"run with ATTNGEN_GENERATED_DIR={tmp_path / 'mine'} for it to load these" in stdout


def test_build_refuses_to_write_into_the_package(installed, tmp_path, monkeypatch, spec_a, capsys):
    from attngen import env

    package = tmp_path / "site-packages" / "attngen"
    (package / "_generated").mkdir(parents=True)
    monkeypatch.setattr(env, "PACKAGE_DIR", package)
    rc, stdout, stderr = run(capsys, "build", spec_a, "--out", package / "_generated")
    assert rc == 2 and stdout == ""
    assert f"{package / '_generated'}: inside the installed attngen package" in stderr
    assert "read-only" in stderr and "--out" in stderr
    assert tree(package) == {}
    # reading is fine: --check writes nothing
    assert run(capsys, "build", spec_a, "--out", package / "_generated", "--check")[0] == 1


# ---- the bare command, --version -------------------------------------------------------------------


def test_version_is_the_package_version(capsys):
    from attngen import __version__

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    rc, stdout, stderr = run(capsys, "--version")
    assert (rc, stdout, stderr) == (0, f"attngen {__version__}\n", "")
    with open(REPO_ROOT / "pyproject.toml", "rb") as fh:
        assert tomllib.load(fh)["project"]["version"] == __version__


def test_no_arguments_prints_the_commands_and_exits_0(capsys):
    from attngen.cli import COMMANDS

    rc, stdout, stderr = run(capsys)
    assert rc == 0 and stderr == ""
    assert stdout.startswith("usage: attngen ")
    for cmd in COMMANDS:
        assert any(line.split()[:1] == [cmd.name] and cmd.help in line for line in stdout.splitlines()), (
            f"{cmd.name} missing from:\n{stdout}")
    assert "--version" in stdout


def test_unknown_command_or_option_exits_2(capsys):
    rc, _, stderr = run(capsys, "bogus")
    assert rc == 2 and "invalid choice: 'bogus'" in stderr
    rc, _, stderr = run(capsys, "build", "--nope")
    assert rc == 2 and "unrecognized arguments: --nope" in stderr


def test_explain_without_a_gpu_is_a_clear_error(capsys, monkeypatch):
    """`attngen explain --device cuda` on a machine without a GPU: exit 1 (the machine
    lacks what the command needs) and a one-line message, no traceback."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, out, err = run(capsys, "explain", "--shape", "2,6,6,113,203,40", "--causal", "--device", "cuda")
    assert code == 1 and out == ""
    assert "needs a CUDA GPU" in err and "--device cpu" in err and "Traceback" not in err
