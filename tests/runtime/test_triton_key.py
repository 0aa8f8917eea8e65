"""The remembered Triton cache key (attngen/runtime/tritonkey.py): the record is used only while
Triton's files are unchanged, and an installed key equals Triton's own."""

from __future__ import annotations

import json
import os

import pytest

from attngen.runtime import tritonkey


def _fake_triton(root):
    (root / "compiler").mkdir(parents=True)
    (root / "compiler" / "compiler.py").write_text("x = 1\n")
    (root / "_C").mkdir()
    (root / "_C" / "libtriton.so").write_bytes(b"\x7fELF" + os.urandom(64))
    (root / "README.txt").write_text("not part of the key\n")
    return root


class Computer:
    def __init__(self, value="3.6.0-abc"):
        self.value, self.calls = value, 0

    def __call__(self):
        self.calls += 1
        return self.value


def test_record_reused_while_files_are_unchanged(tmp_path):
    root, record = _fake_triton(tmp_path / "triton"), tmp_path / "cache" / "triton_key.json"
    first = Computer()
    assert tritonkey.remembered(first, root, "3.6.0", record) == "3.6.0-abc" and first.calls == 1
    assert json.loads(record.read_text())["key"] == "3.6.0-abc"
    second = Computer("3.6.0-other")  # a later process: the record answers, nothing is hashed
    assert tritonkey.remembered(second, root, "3.6.0", record) == "3.6.0-abc" and second.calls == 0
    (root / "README.txt").write_text("changed, but not a file the key reads\n")
    assert tritonkey.remembered(second, root, "3.6.0", record) == "3.6.0-abc" and second.calls == 0


@pytest.mark.parametrize("change", ["edit_py", "touch_lib", "new_py", "version", "corrupt", "foreign"])
def test_record_dropped_when_anything_changes(tmp_path, change):
    root, record = _fake_triton(tmp_path / "triton"), tmp_path / "triton_key.json"
    tritonkey.remembered(Computer(), root, "3.6.0", record)
    version = "3.6.0"
    if change == "edit_py":
        (root / "compiler" / "compiler.py").write_text("x = 22\n")  # size changes
    elif change == "touch_lib":  # same size, later mtime
        lib = root / "_C" / "libtriton.so"
        st = lib.stat()
        os.utime(lib, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    elif change == "new_py":
        (root / "compiler" / "extra.py").write_text("")
    elif change == "version":
        version = "3.6.1"
    elif change == "corrupt":
        record.write_text("{not json")
    elif change == "foreign":  # a record whose key is not of this Triton
        data = json.loads(record.read_text())
        record.write_text(json.dumps({**data, "key": "9.9.9-x"}))
    fresh = Computer(f"{version}-new")
    assert tritonkey.remembered(fresh, root, version, record) == f"{version}-new" and fresh.calls == 1
    assert json.loads(record.read_text())["key"] == f"{version}-new"


def test_unwritable_record_still_gives_the_key(tmp_path):
    root = _fake_triton(tmp_path / "triton")
    blocker = tmp_path / "file"
    blocker.write_text("")
    comp = Computer()
    assert tritonkey.remembered(comp, root, "3.6.0", blocker / "sub" / "triton_key.json") == "3.6.0-abc"


def test_install_gives_tritons_own_key(tmp_path, monkeypatch):
    import triton.runtime.cache as cache

    monkeypatch.setattr(tritonkey.env, "interpreting", lambda: False)
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cache, "triton_key", cache.triton_key)  # restored after the test
    import triton.runtime.autotuner as autotuner

    monkeypatch.setattr(autotuner, "triton_key", autotuner.triton_key)
    own = cache.triton_key()
    assert tritonkey.install() and tritonkey.install()  # idempotent
    assert cache.triton_key is not cache.triton_key.original and cache.triton_key() == own
    assert json.loads((tmp_path / tritonkey.RECORD).read_text())["key"] == own
    assert autotuner.triton_key is cache.triton_key


def test_switched_off(monkeypatch):
    monkeypatch.setattr(tritonkey.env, "interpreting", lambda: False)
    monkeypatch.setenv("ATTNGEN_TRITON_KEY_CACHE", "0")
    assert not tritonkey.install()
    monkeypatch.delenv("ATTNGEN_TRITON_KEY_CACHE")
    monkeypatch.setattr(tritonkey.env, "interpreting", lambda: True)
    assert not tritonkey.install()


def test_seed_from_a_pack_record(tmp_path):
    root, record = _fake_triton(tmp_path / "triton"), tmp_path / "mine" / "triton_key.json"
    built = tmp_path / "builder.json"  # the process that wrote the pack, on this install
    tritonkey.remembered(Computer("3.6.0-built"), root, "3.6.0", built)
    candidate = json.loads(built.read_text())
    assert not tritonkey.seed_record({**candidate, "fingerprint": "0" * 64}, root, "3.6.0", record)
    assert not record.exists()
    assert not tritonkey.seed_record(candidate, root, "3.6.1", record)  # another Triton
    assert tritonkey.seed_record(candidate, root, "3.6.0", record)
    comp = Computer()
    assert tritonkey.remembered(comp, root, "3.6.0", record) == "3.6.0-built" and comp.calls == 0
    assert tritonkey.seed_record({"junk": 1}, root, "3.6.0", record)  # a valid record stays
    (root / "compiler" / "compiler.py").write_text("changed = True\n")  # the install changed since
    assert not tritonkey.seed_record(candidate, root, "3.6.0", tmp_path / "other.json")
