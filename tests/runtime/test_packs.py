"""Compiled-kernel packs on the CPU (attngen.runtime.packs, packwrite), over real Triton artifacts:
a small kernel compiled for sm90 with Triton's own ptxas, and its C launcher built by Triton with
the C compiler against a stand-in libcuda.so.1 (an empty shared library: the launcher only needs
one to link and load; it is never called). Checked: the manifest, byte-identical packs from two
compiles, the round trip into an empty TRITON_CACHE_DIR after which Triton compiles nothing and
builds no launcher (and without the pack it does both), entries that do not fit this process
skipped with their reasons, unsafe archives refused, and the runtime's autoload. The GPU twin,
through attngen's own kernels: tests/gpu/test_gpu_packs.py."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from attngen import env
from attngen.env import REPO_ROOT
from attngen.runtime import loader, packs, packwrite

TINY_MODULE = '''\
import triton
import triton.language as tl

URI = "test_tiny_add"
KERNEL_HASH = "0123456789abcdef"


@triton.jit
def _tiny_add(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + offs, tl.load(X + offs, mask=offs < n) + 1.0, mask=offs < n)
'''

# compile the kernel (sm90) and build its launcher in a Capture: a function both scripts run
COMMON = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.driver import CudaLauncher
    from triton.compiler import ASTSource
    from attngen.runtime import loader, packs, packwrite

    out = Path(sys.argv[1])
    mod = loader.load_path(out / "tinymod.py")

    def run():
        src = ASTSource(mod._tiny_add, {"X": "*fp32", "Y": "*fp32", "n": "i32", "BLOCK": "constexpr"}, {"BLOCK": 128})
        ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
        flags = sys.getdlopenflags()
        sys.setdlopenflags(os.RTLD_LAZY)  # the stand-in libcuda defines none of the launcher's symbols
        try:
            CudaLauncher(src, ck.metadata)
        finally:
            sys.setdlopenflags(flags)
        return ck
""")

BUILD = COMMON + textwrap.dedent("""
    def build(name):
        with packwrite.Capture() as cap:
            run()
        try:
            return packwrite.write_pack(out / name, cap, rows=[{"entry": "tiny"}], built={"by": "test"})
        finally:
            cap.close()

    print(json.dumps([build("a.pack"), build("b.pack")]))
""")

ROUND_TRIP = COMMON + textwrap.dedent("""
    import hashlib
    from triton import knobs
    from attngen.bench.startup import StartupProbe, compiled_anything

    probe = StartupProbe().install()
    knobs.cache.dir = str(out / "cache_packed")
    with probe.phase("load"):
        first = packs.load_pack(out / "a.pack", archs={90})
    with probe.phase("packed"):
        ck = run()
    again = packs.load_pack(out / "a.pack", archs={90})
    knobs.cache.dir = str(out / "cache_cold")
    with probe.phase("cold"):
        run()
    probe.uninstall()
    ph = probe.summary()
    from attngen import env
    from attngen.runtime import tritonkey
    import triton.runtime.cache
    record = json.loads((env.cache_dir() / tritonkey.RECORD).read_text())
    hashed = triton.runtime.cache.triton_key.original.cache_info().misses  # Triton's own triton_key() runs
    print(json.dumps({"first": first.as_dict(), "again": again.as_dict(), "phases": ph, "record": record,
                      "hashed": hashed,
                      "cubin": hashlib.sha256(ck.asm["cubin"]).hexdigest(),
                      "packed": compiled_anything(ph["packed"]), "cold": compiled_anything(ph["cold"])}))
""")


def _run(script: str, folder, stub) -> dict:
    environ = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_LIBCUDA_PATH": str(stub),
               "LD_LIBRARY_PATH": str(stub), "TRITON_CACHE_DIR": str(folder / "triton_default"),
               "ATTNGEN_SHIPPED_PACKS": "0",  # the packs these tests make, only
               # each script a machine of its own for the remembered Triton key (runtime.tritonkey)
               "ATTNGEN_CACHE_DIR": str(folder / f"attngen_cache_{hashlib.sha256(script.encode()).hexdigest()[:8]}")}
    environ.pop("ATTNGEN_PACKS", None)
    res = subprocess.run([sys.executable, "-c", script, str(folder)], capture_output=True, text=True,
                         env=environ, cwd=REPO_ROOT, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(folder, stub libcuda folder, write_pack's summaries) with a.pack and b.pack: the same
    kernel and launcher compiled twice, each in a fresh cache."""
    cc = shutil.which("gcc") or shutil.which("cc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler: Triton cannot build a launcher here")
    folder = tmp_path_factory.mktemp("packs")
    stub = folder / "stub"
    stub.mkdir()
    (stub / "stub.c").write_text("int attngen_stub_libcuda;\n")
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(stub / "libcuda.so.1"), str(stub / "stub.c")], check=True)
    (folder / "tinymod.py").write_text(TINY_MODULE)
    return folder, stub, _run(BUILD, folder, stub)


def manifest_of(path) -> dict:
    with zipfile.ZipFile(path) as zf:
        return json.loads(zf.read(packs.MANIFEST))


def entries_of(path) -> list[tuple[dict, dict]]:
    """(entry, {file: bytes}) of each entry of a pack, as write_pack takes them."""
    with zipfile.ZipFile(path) as zf:
        return [(e, {r["name"]: zf.read(packs.member(e["dir"], r["name"])) for r in e["files"]})
                for e in manifest_of(path)["entries"]]


def test_manifest_describes_each_entry(built):
    folder, _, summaries = built
    man = manifest_of(folder / "a.pack")
    assert (man["format"], man["version"], man["warmup"], man["built"]) == (
        packs.FORMAT, packs.VERSION, [{"entry": "tiny"}], {"by": "test"})
    kinds = sorted(e["kind"] for e in man["entries"])
    assert kinds == ["c_module", "kernel"], kinds
    kernel = next(e for e in man["entries"] if e["kind"] == "kernel")
    launcher = next(e for e in man["entries"] if e["kind"] == "c_module")
    import triton

    for e in (kernel, launcher):
        assert e["triton_version"] == triton.__version__ and len(e["triton_key"]) == 64, e
        assert packs.ENTRY_DIR.fullmatch(e["dir"]), e["dir"]
    assert kernel["target"] == {"backend": "cuda", "arch": 90, "warp_size": 32}, kernel["target"]
    assert "release" in kernel["ptxas"] and kernel["triton_settings"] == {}, kernel
    assert sorted(r["name"] for r in kernel["files"]) == ["_tiny_add.cubin", "_tiny_add.json"]
    assert kernel["group"] == "_tiny_add.json" and kernel["options"]["num_warps"] == 4, kernel
    assert kernel["kernel"] == {"function": "_tiny_add", "module": "tinymod", "uri": "test_tiny_add",
                                "kernel_hash": "0123456789abcdef", "constexprs": {"BLOCK": 128}}, kernel["kernel"]
    assert launcher["name"] == "__triton_launcher", launcher
    assert launcher["abi"] == packs.launcher_abi(), launcher["abi"]
    with zipfile.ZipFile(folder / "a.pack") as zf:
        names = zf.namelist()
        assert names[0] == packs.MANIFEST and names[1:] == sorted(names[1:]), names
        for e in man["entries"]:
            for r in e["files"]:
                assert hashlib.sha256(zf.read(packs.member(e["dir"], r["name"]))).hexdigest() == r["sha256"]
    assert summaries[0]["kernel"]["entries"] == 1 and summaries[0]["c_module"]["entries"] == 1, summaries


def test_same_inputs_give_byte_identical_packs(built, tmp_path):
    folder, _, _ = built
    a = (folder / "a.pack").read_bytes()
    assert a == (folder / "b.pack").read_bytes(), "two compiles of the same kernel, two different packs"
    packwrite.write_pack(tmp_path / "c.pack", entries_of(folder / "a.pack"), rows=[{"entry": "tiny"}],
                         built={"by": "test"}, key_record=manifest_of(folder / "a.pack")["triton_key_record"])
    assert (tmp_path / "c.pack").read_bytes() == a


def test_round_trip_into_an_empty_cache_compiles_nothing(built):
    """Loaded into an empty TRITON_CACHE_DIR, the kernel is a cache hit (no compile, no ptxas) and
    the launcher is found (no C compiler); loading again finds both present; the same calls on
    another empty cache compile both, as the probe sees."""
    folder, stub, _ = built
    out = _run(ROUND_TRIP, folder, stub)
    first, again, ph = out["first"], out["again"], out["phases"]
    assert first["error"] is None and len(first["taken"]) == 2 and not first["skipped"], first
    assert first["cache_dir"] == str(folder / "cache_packed"), first
    assert again["present"] == first["taken"] and not again["taken"], again
    assert out["packed"] == [] and ph["packed"].get("cache_hits") == 1, (out["packed"], ph["packed"])
    assert ph["packed"].get("c_modules:__triton_launcher") == 1, ph["packed"]
    assert {"compiles=1", "ptxas_runs=1", "c_compiler_runs=1"} <= set(out["cold"]), out["cold"]
    kernel = next(e for e in manifest_of(folder / "a.pack")["entries"] if e["kind"] == "kernel")
    cubin = next(r for r in kernel["files"] if r["name"].endswith(".cubin"))
    assert out["cubin"] == cubin["sha256"], "Triton ran another cubin than the pack's"
    # the pack's record of Triton's key, made on this install, became this process's: nothing hashed
    carried = manifest_of(folder / "a.pack")["triton_key_record"]
    import triton

    assert carried["key"].startswith(triton.__version__) and out["record"] == carried
    assert out["hashed"] == 0
    group = json.loads((folder / "cache_packed" / kernel["dir"] / f"__grp__{kernel['group']}").read_text())
    assert set(group["child_paths"]) == {"_tiny_add.cubin", "_tiny_add.json"}, group


MISFITS = [  # (what is changed in the entry, the reason's words)
    ("kernel", {"triton_version": "3.5.0"}, "built by Triton 3.5.0"),
    ("kernel", {"triton_key": "0" * 64}, "triton_key() differs"),
    ("kernel", {"target": {"backend": "cuda", "arch": 80, "warp_size": 32}}, "built for sm80"),
    ("kernel", {"ptxas": "Cuda compilation tools, release 11.0, V11.0.1"}, "release 11.0"),
    ("kernel", {"target": {"backend": "hip", "arch": "gfx942", "warp_size": 64}}, "CUDA kernels"),
    ("kernel", {"triton_settings": {"TRITON_DISABLE_LINE_INFO": "true"}}, "TRITON_DISABLE_LINE_INFO"),
    ("c_module", {"abi": {"python": "3.9", "ext_suffix": ".cpython-39-x86_64-linux-gnu.so", "platform": "x"}},
     "python '3.9'"),
    ("c_module", {"abi": {**packs.launcher_abi(), "ext_suffix": ".abi3.so"}}, "ext_suffix '.abi3.so'"),
    ("c_module", {"abi": {**packs.launcher_abi(), "platform": "aarch64,Linux,64bit,ELF"}}, "platform"),
    ("c_module", {"triton_version": "3.7.0"}, "built by Triton 3.7.0"),
]


@pytest.mark.parametrize("kind, change, words", MISFITS, ids=lambda x: str(x)[:40])
def test_entries_that_do_not_fit_are_skipped_with_the_reason(built, tmp_path, kind, change, words):
    folder, _, _ = built
    entries = [({**e, **change} if e["kind"] == kind else e, blobs) for e, blobs in entries_of(folder / "a.pack")]
    packwrite.write_pack(tmp_path / "m.pack", entries)
    report = packs.load_pack(tmp_path / "m.pack", cache_dir=tmp_path / "cache", archs={90})
    assert report.error is None and len(report.taken) == 1 and len(report.skipped) == 1, report
    name, reason = report.skipped[0]
    assert name.startswith(kind) and words in reason, report
    changed = next(e for e, _ in entries if e["kind"] == kind)
    assert not (tmp_path / "cache" / changed["dir"]).exists(), "a skipped entry was written"


def test_no_visible_gpu_of_the_entry_architecture_skips_kernels(built, tmp_path):
    folder, _, _ = built
    report = packs.load_pack(folder / "a.pack", cache_dir=tmp_path / "c", archs=set())
    assert [r for _, r in report.skipped] == ["built for sm90; this machine's GPUs: none visible"], report
    assert len(report.taken) == 1 and report.taken[0].startswith("c_module"), report


def _pack_with(tmp_path, entries, members) -> str:
    """A pack whose manifest lists `entries`, with archive `members` ({name: (bytes, unix mode)})."""
    path = tmp_path / "evil.pack"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(packs.MANIFEST, json.dumps({"format": packs.FORMAT, "version": packs.VERSION, "entries": entries}))
        for name, (data, mode) in members.items():
            info = zipfile.ZipInfo(name)
            info.create_system, info.external_attr = 3, mode << 16
            zf.writestr(info, data)
    return path


def test_unsafe_names_links_and_altered_content_are_refused(built, tmp_path):
    folder, _, _ = built
    good = next(e for e, _ in entries_of(folder / "a.pack") if e["kind"] == "c_module")
    data = b"payload"
    rec = {"name": "x.so", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    d = good["dir"]
    entries = [
        {**good, "dir": "../../escape", "files": [rec]},
        {**good, "files": [{**rec, "name": "../evil"}]},
        {**good, "files": [{**rec, "name": ".hidden"}]},
        {**good, "files": [{**rec, "name": "__grp__x.json"}]},
        {**good, "dir": d[:-1] + "A", "files": [{**rec, "name": "link.so"}]},
        {**good, "dir": d[:-1] + "B", "files": [{**rec, "name": "altered.so"}]},
        {**good, "dir": d[:-1] + "C", "files": [{**rec, "name": "missing.so"}]},
        {**good, "dir": d[:-1] + "D", "files": [rec]},
    ]
    members = {
        "entries/../../escape/x.so": (data, 0o100644),
        f"entries/{d}/../evil": (data, 0o100644),
        f"entries/{d[:-1]}A/link.so": (b"/etc/passwd", 0o120777),  # a symbolic link
        f"entries/{d[:-1]}B/altered.so": (b"tampered", 0o100644),
        f"entries/{d[:-1]}D/x.so": (data, 0o100644),
    }
    cache = tmp_path / "deep" / "cache"
    report = packs.load_pack(_pack_with(tmp_path, entries, members), cache_dir=cache, archs={90})
    reasons = [r for _, r in report.skipped]
    assert len(report.taken) == 1 and len(reasons) == 7, report
    assert reasons[0].startswith("unsafe or malformed cache folder name '../../escape'"), reasons
    assert reasons[1:4] == ["unsafe file name '../evil'", "unsafe file name '.hidden'",
                            "unsafe file name '__grp__x.json'"], reasons
    assert "not a regular file" in reasons[4] and "bytes in the archive" in reasons[5], reasons
    assert "no such member" in reasons[6], reasons
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert written == ["deep/cache/" + d[:-1] + "D/x.so", "evil.pack"], written


def test_an_unreadable_pack_is_a_report_not_an_exception(tmp_path):
    (tmp_path / "junk.pack").write_bytes(b"not a zip")
    bad = [packs.load_pack(tmp_path / "junk.pack", cache_dir=tmp_path),
           packs.load_pack(tmp_path / "none.pack", cache_dir=tmp_path),
           packs.load_pack(_pack_with(tmp_path, [], {}), cache_dir=tmp_path, archs={90})]
    with zipfile.ZipFile(tmp_path / "old.pack", "w") as zf:
        zf.writestr(packs.MANIFEST, json.dumps({"format": packs.FORMAT, "version": 99, "entries": []}))
    bad.append(packs.load_pack(tmp_path / "old.pack", cache_dir=tmp_path))
    assert "File is not a zip file" in bad[0].error and "none.pack" in bad[1].error, bad
    assert bad[2].error is None and not bad[2].taken, bad[2]  # an empty pack is a pack
    assert "format version 99" in bad[3].error, bad[3]


def test_pack_paths_are_the_variable_then_the_shipped_folder(tmp_path, monkeypatch):
    (tmp_path / "packs").mkdir()
    for name in ("b.pack", "a.pack", "notes.txt"):
        (tmp_path / "packs" / name).write_text("")
    monkeypatch.setattr(env, "PACKAGE_DIR", tmp_path)
    monkeypatch.setenv("ATTNGEN_PACKS", os.pathsep.join(["/x/one.pack", "", "/y/two.pack"]))
    assert env.pack_paths() == [Path(p) for p in ("/x/one.pack", "/y/two.pack")] + [
        tmp_path / "packs" / "a.pack", tmp_path / "packs" / "b.pack"]


def test_autoload_runs_once_and_warns_for_a_pack_it_cannot_use(tmp_path, monkeypatch):
    calls = []
    reports = {"bad.pack": packs.PackReport("bad.pack", error="File is not a zip file"),
               "skip.pack": packs.PackReport("skip.pack", skipped=[("kernel k", "built for sm80")]),
               "ok.pack": packs.PackReport("ok.pack", taken=["kernel k"])}
    monkeypatch.setattr(packs, "load_pack", lambda p: calls.append(p.name) or reports[p.name])
    monkeypatch.setattr(env, "interpreting", lambda: False)
    monkeypatch.setenv("ATTNGEN_PACKS", os.pathsep.join(str(tmp_path / n) for n in reports))
    monkeypatch.setenv("ATTNGEN_SHIPPED_PACKS", "0")
    monkeypatch.setattr(packs, "_AUTO", None)
    with pytest.warns(RuntimeWarning) as seen:
        packs.autoload()
        packs.autoload()
    assert calls == ["bad.pack", "skip.pack", "ok.pack"], calls
    assert [str(w.message) for w in seen] == [
        "attngen: pack bad.pack: not loaded: File is not a zip file",
        "attngen: none of the entries of skip.pack fit this process (first: built for sm80)"], seen
    assert [r.path for r in packs.loaded()] == ["bad.pack", "skip.pack", "ok.pack"]


def test_the_loader_loads_packs_before_its_first_module(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(packs, "autoload", lambda: calls.append(1))
    (tmp_path / "mod_for_autoload.py").write_text("X = 1\n")
    assert loader.load_path(tmp_path / "mod_for_autoload.py").X == 1
    assert calls == [1]


def test_shipped_packs_are_whole(tmp_path, monkeypatch):
    """The packs shipped in attngen/packs/ read, name only files a pack may hold, are for sm90
    and the shipped Triton, and carry Triton's key record; loading one never fails (on a machine
    whose Triton differs every entry is skipped, with the reason)."""
    import triton

    monkeypatch.delenv("ATTNGEN_SHIPPED_PACKS", raising=False)
    shipped = env.shipped_packs()
    assert shipped, "no pack in attngen/packs/"
    for path in shipped:
        with zipfile.ZipFile(path) as zf:
            manifest = packs.read_manifest(zf)
            names = set(zf.namelist())
        kernels = [e for e in manifest["entries"] if e["kind"] == "kernel"]
        assert kernels and all(packs.unsafe(e) is None for e in manifest["entries"])
        assert all(packs.member(e["dir"], r["name"]) in names for e in manifest["entries"] for r in e["files"])
        assert {e["target"]["arch"] for e in kernels} == {90}
        assert {e["triton_version"] for e in kernels} == {triton.__version__}
        assert all(e["kernel"]["uri"].startswith("attn_") for e in kernels)
        assert manifest["triton_key_record"]["key"].startswith(triton.__version__)
        report = packs.load_pack(path, cache_dir=tmp_path / "cache", archs={90})
        assert report.error is None and len(report.taken) + len(report.skipped) == len(manifest["entries"])
    monkeypatch.setenv("ATTNGEN_PACKS", str(tmp_path / "mine.pack"))
    assert env.pack_paths() == [tmp_path / "mine.pack", *shipped]  # the user's first
    monkeypatch.setenv("ATTNGEN_SHIPPED_PACKS", "0")
    assert env.shipped_packs() == [] and env.pack_paths() == [tmp_path / "mine.pack"]


def test_shipped_packs_hold_the_current_generated_kernels(monkeypatch):
    """Each kernel of a shipped pack comes from a module generated/ holds now (its file name carries
    the source hash) with the same kernel hash. A kernel change makes the pack's entries dead
    weight, never looked up again, and the first call compiles: rebuild the pack on the GPU
    machine when this fails (docs/serving.md, "The shipped pack")."""
    from attngen.codegen.hashing import stamped_kernel_hash

    monkeypatch.delenv("ATTNGEN_SHIPPED_PACKS", raising=False)
    manifest = json.loads((REPO_ROOT / "generated" / "manifest.json").read_text())["kernels"]
    assert env.shipped_packs(), "no pack in attngen/packs/"
    for path in env.shipped_packs():
        with zipfile.ZipFile(path) as zf:
            kernels = [e["kernel"] for e in packs.read_manifest(zf)["entries"] if e["kind"] == "kernel"]
        assert kernels
        stale = []
        for k in kernels:
            ent = manifest.get(k["uri"])
            if (not ent or ent["file"] != f"{k['module']}.py"
                    or stamped_kernel_hash((REPO_ROOT / "generated" / ent["file"]).read_text()) != k["kernel_hash"]):
                stale.append((path.name, k["module"], k["function"]))
        assert stale == []
