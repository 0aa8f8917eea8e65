"""The kernel hash (a generated module's content hash without its stamp), by which tuned winners
are keyed: it moves with the module's code and nothing else."""

from __future__ import annotations

import json
import shutil
import sqlite3

from attngen.codegen.naming import kernel_hash
from attngen.codegen.render import render
from attngen.env import REPO_ROOT
from attngen.spec import KernelSpec

GENERATED = REPO_ROOT / "generated"


def spec(**changes) -> KernelSpec:
    base = KernelSpec(family="fwd", dtype="fp16", target="sm90", head_dim_qk=128, head_dim_v=128, gqa_ratio=4,
                      mask="causal", softcap=False, varlen=False)
    return base.replace(**changes)


def _constant(src: str, name: str) -> str:
    (line,) = [ln for ln in src.splitlines() if ln.startswith(f"{name} = ")]
    return json.loads(line.split(" = ", 1)[1])


def test_every_generated_module_carries_the_hash_of_its_source():
    manifest = json.loads((GENERATED / "manifest.json").read_text())["kernels"]
    for ent in manifest.values():
        src = (GENERATED / ent["file"]).read_text()
        assert _constant(src, "KERNEL_HASH") == kernel_hash(src), ent["file"]
        assert f"# hash:     {kernel_hash(src)} " in src


def test_the_stamped_hash_is_read_back_as_the_tokens_hash():
    """codegen.hashing.stamped_kernel_hash (the tuner's plan reads a rendered module's hash back
    instead of tokenizing it again) gives kernel_hash of the module; a text without the line is
    refused."""
    import pytest

    from attngen.codegen.hashing import stamped_kernel_hash

    for spec in (KernelSpec("fwd", "bf16", "sm90", 128, 128, 4, "causal"), KernelSpec("decode", "fp16", "sm80", 64, 64, 1, "none")):
        text = render(spec)
        assert stamped_kernel_hash(text) == kernel_hash(text)
    with pytest.raises(ValueError, match="no KERNEL_HASH line"):
        stamped_kernel_hash("x = 1\n")


def test_stamp_changes_leave_the_hash_alone():
    ks = spec()
    a, b = render(ks), render(ks, sources=("specs/x.yaml#e (sha256 0123456789abcdef)",))
    assert a != b and kernel_hash(a) == kernel_hash(b)


def test_comments_and_blank_lines_leave_the_hash_alone():
    src = render(spec())
    moved = src.replace("\n\n\n@triton.jit", "\n\n# a comment\n\n\n@triton.jit", 1)
    assert moved != src and kernel_hash(moved) == kernel_hash(src)
    assert kernel_hash(src.replace("BLOCK_N: tl.constexpr", "BLOCK_N: tl.constexpr ", 1)) == kernel_hash(src)
    assert kernel_hash(src.replace("tl.arange(0, BLOCK_M)", "tl.arange(0, BLOCK_N)", 1)) != kernel_hash(src)


def test_partial_change_moves_only_the_modules_whose_code_it_changes(tmp_path):
    """An edit to a partial the module's code does not use (the backward's Gluon main loop, for a
    forward kernel; a comment anywhere) keeps its hash, though the template hash moves; an edit
    to the module's code moves it."""
    root = tmp_path / "templates"
    shutil.copytree(REPO_ROOT / "templates", root)
    fwd, bwd = spec(), spec(family="bwd")
    before = {s.family: kernel_hash(render(s, root=root)) for s in (fwd, bwd)}
    ws_bwd = root / "_bwd_ws_dq.py.jinja"
    ws_bwd.write_text(ws_bwd.read_text() + "{# changed #}\n")
    (root / "_common.py.jinja").write_text((root / "_common.py.jinja").read_text() + "{# changed #}\n")
    assert kernel_hash(render(fwd, root=root)) == before["fwd"]
    fam = root / "attn_fwd.py.jinja"
    fam.write_text(fam.read_text().replace("off_hkv = off_h // GQA", "off_hkv = off_h // GQA + 0", 1))
    assert kernel_hash(render(fwd, root=root)) != before["fwd"]


def test_every_shipped_winner_finds_its_module():
    """The shipped database's winners are keyed by the KERNEL_HASH of a module of generated/ (a
    stale winner is ignored by the runtime: the shipped one must not be)."""
    manifest = json.loads((GENERATED / "manifest.json").read_text())["kernels"]
    current = {uri: _constant((GENERATED / ent["file"]).read_text(), "KERNEL_HASH") for uri, ent in manifest.items()}
    conn = sqlite3.connect(f"file:{REPO_ROOT / 'tuning_db' / 'attngen.sqlite'}?mode=ro", uri=True)
    rows = conn.execute("SELECT k.uri, k.template_hash FROM attngen_kernels k "
                        "JOIN attngen_winners w ON w.kernel_id = k.id").fetchall()
    conn.close()
    assert rows
    assert [(uri, h) for uri, h in rows if current.get(uri) != h] == []


def test_an_f_string_hashes_as_one_string_token():
    """Python 3.12 splits an f-string into FSTRING_START / MIDDLE / END tokens, with the names
    and operators of its fields in between, and renumbers the token types (OP 54 -> 55); the hash
    takes the f-string back to one STRING token of its source text and numbers types as 3.11 does,
    so a winner tuned under one Python (the GPU machine's 3.12) is found under another (3.11)."""
    from attngen.codegen.hashing import _tokens

    src = 'x = f"a{b + 1:>{w}}c" + g(1)\n'
    toks = [(kind, text) for kind, text, _ in _tokens(src)]
    assert toks == [(1, "x"), (54, "="), (3, 'f"a{b + 1:>{w}}c"'), (54, "+"), (1, "g"), (54, "("), (2, "1"),
                    (54, ")"), (4, "\n")]


def _other_pythons():
    import glob
    found = [shutil.which(f"python3.{m}") for m in range(8, 20)]
    found += glob.glob("/root/.pyenv/versions/3.*/bin/python3")
    return sorted({p for p in found if p})


def test_the_hash_is_the_same_under_every_python_here():
    """Every generated module hashes the same under each Python 3.11+ interpreter this machine
    has (the file attngen/codegen/hashing.py loaded alone: it needs only the standard library).
    The Python running the tests is always one of them."""
    import subprocess
    import sys

    path = REPO_ROOT / "attngen" / "codegen" / "hashing.py"
    files = sorted(str(f) for f in GENERATED.glob("*.py"))
    prog = ("import importlib.util, json, sys\n"
            f"s = importlib.util.spec_from_file_location('h', {str(path)!r}); m = importlib.util.module_from_spec(s)\n"
            "s.loader.exec_module(m)\n"
            "print(json.dumps([m.kernel_hash(open(f).read()) for f in sys.argv[1:]]))\n")
    # each interpreter once (a pyenv shim and the version's own binary are one interpreter), all
    # hashing at once
    seen, procs = set(), []
    for py in [sys.executable] + _other_pythons():
        ver = subprocess.run([py, "-c", "import os, sys; print(sys.version_info >= (3, 11), os.path.realpath(sys.executable))"],
                             capture_output=True, text=True)
        ok, _, real = ver.stdout.strip().partition(" ")
        if ok != "True" or real in seen:
            continue
        seen.add(real)
        procs.append((py, subprocess.Popen([py, "-c", prog, *files], stdout=subprocess.PIPE, text=True)))
    want = [kernel_hash(open(f).read()) for f in files]
    assert want == [_constant(open(f).read(), "KERNEL_HASH") for f in files]
    ran = 0
    for py, proc in procs:
        out, _ = proc.communicate()
        assert proc.returncode == 0, py
        assert json.loads(out) == want, py
        ran += 1
    assert ran >= 1
