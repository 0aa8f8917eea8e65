"""The runtime's read side: attngen.db.winners.lookup over a database written by the store
(exact bucket, nearest bucket, nothing tuned, template changed, config layout changed), read once
and read-only, without optuna/SQLAlchemy, and a clear error for a database it cannot use."""

from __future__ import annotations

import dataclasses
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import warnings

import pytest

from attngen.db import schema
from attngen.db import store as dbs
from attngen.db import winners
from attngen.buckets import bucket_of, parse_bucket
from attngen.configs import BwdConfig, FwdConfig

URI = "attn_fwd_bf16_hd128_gqa4_causal_sm90"
BURI = "attn_bwd_bf16_hd128_gqa4_causal_sm90"
DEVICE = dict(device_class="h100", gpu_name="NVIDIA H200", capability="9.0", driver="570.00",
              cuda_version="12.8", torch_version="2.11.0", triton_version="3.6.0")
CFG = {"q1024_k1024_bh32": FwdConfig(64, 64, 4, 3), "q8192_k8192_bh32": FwdConfig(128, 64, 8, 2)}


def write(url, rows, default_ms=2.0):
    """rows: (uri, template hash, family, device class, bucket key, config dict); each winner took
    1 ms, its study's default config `default_ms` (a dict: per bucket key)"""
    with dbs.Store(url, "create") as st:
        with st.session() as s:
            dev = dbs.find_or_add_device(s, DEVICE)
            for uri, h, fam, cls, key, cfg in rows:
                k = dbs.find_or_add_kernel(s, uri, h, fam, {})
                b = dbs.find_or_add_bucket(s, key)
                t = dbs.add_trial(s, kernel=k, device=dev, bucket=b, config=cfg, status="ok",
                                  shape={}, time_ms=1.0, tflops=1.0)
                dms = default_ms[key] if isinstance(default_ms, dict) else default_ms
                assert dbs.offer_winner(s, t, cls, dms, 1.0 / dms)
        assert st.pack()


@pytest.fixture
def db(tmp_path, monkeypatch):
    path = tmp_path / "attngen.sqlite"
    monkeypatch.setenv("ATTNGEN_DB", str(path))
    winners.reset()
    yield path
    winners.reset()


def test_exact_nearest_and_untuned(db):
    write(db, [(URI, "h1", "fwd", "h100", k, dataclasses.asdict(c)) for k, c in CFG.items()]
          + [(BURI, "h1", "bwd", "a100", "q4096_k4096_bh32",
              dataclasses.asdict(BwdConfig(64, 64, 4, 2, 128, 64, 8, 3, True)))])
    assert winners.lookup(URI, "h1", "h100", parse_bucket("q1024_k1024_bh32")) == dataclasses.asdict(
        FwdConfig(64, 64, 4, 3))
    # not tuned: the nearest tuned bucket (1k for 2k/bh16, 8k for 16k)
    assert winners.lookup(URI, "h1", "h100", bucket_of(2000, 2000, 16)) == dataclasses.asdict(CFG["q1024_k1024_bh32"])
    assert winners.lookup(URI, "h1", "h100", bucket_of(16384, 16384, 64)) == dataclasses.asdict(CFG["q8192_k8192_bh32"])
    assert winners.lookup(URI, "h1", "h100", bucket_of(1, 4096, 32)) is None  # decode: never a prefill config
    assert winners.lookup(URI, "h1", "a100", bucket_of(1024, 1024, 32)) is None  # another device class
    assert winners.lookup("attn_fwd_other_sm90", "h1", "h100", bucket_of(1024, 1024, 32)) is None
    assert winners.lookup(BURI, "h1", "a100", bucket_of(4096, 4096, 32))["atomic_dq"] is True
    got = winners.lookup(URI, "h1", "h100", parse_bucket("q1024_k1024_bh32"))
    got["block_m"] = 1  # a copy: the cache stays intact
    assert winners.lookup(URI, "h1", "h100", parse_bucket("q1024_k1024_bh32"))["block_m"] == 64


def test_a_winner_within_noise_of_the_default_leaves_the_default(db):
    """A winner less than MIN_GAIN faster than its study's default config is noise: that bucket
    and the untuned buckets nearest to it get None (the default table serves); a clear win serves."""
    write(db, [(URI, "h1", "fwd", "h100", k, dataclasses.asdict(c)) for k, c in CFG.items()],
          default_ms={"q1024_k1024_bh32": 1.0 + winners.MIN_GAIN / 2, "q8192_k8192_bh32": 1.0 + 2 * winners.MIN_GAIN})
    assert winners.lookup(URI, "h1", "h100", parse_bucket("q1024_k1024_bh32")) is None
    assert winners.lookup(URI, "h1", "h100", bucket_of(2000, 2000, 16)) is None  # nearest: 1k
    assert winners.lookup(URI, "h1", "h100", parse_bucket("q8192_k8192_bh32")) == dataclasses.asdict(
        CFG["q8192_k8192_bh32"])
    assert winners.lookup(URI, "h1", "h100", bucket_of(16384, 16384, 64)) == dataclasses.asdict(
        CFG["q8192_k8192_bh32"])


def test_a_gpu_models_class_falls_back_to_its_parents_winners_bucket_by_bucket(db):
    """An H200 (class h200) is served its own winners where it has them and h100's elsewhere,
    the nearest bucket sought over both; an H100 never sees h200's; h200's winner within noise of
    the default leaves that bucket to the default table, not to h100's winner."""
    h200 = {"q8192_k8192_bh32": FwdConfig(128, 128, 8, 2), "q4096_k4096_bh32": FwdConfig(64, 128, 4, 2)}
    write(db, [(URI, "h1", "fwd", "h100", k, dataclasses.asdict(c)) for k, c in CFG.items()]
          + [(URI, "h1", "fwd", "h200", k, dataclasses.asdict(c)) for k, c in h200.items()],
          default_ms={"q1024_k1024_bh32": 2.0, "q8192_k8192_bh32": 2.0,
                      "q4096_k4096_bh32": 1.0 + winners.MIN_GAIN / 2})
    at = parse_bucket
    assert winners.find(URI, "h1", "h200", at("q8192_k8192_bh32"))[::3] == (
        dataclasses.asdict(h200["q8192_k8192_bh32"]), "h200")
    assert winners.find(URI, "h1", "h200", at("q1024_k1024_bh32"))[::3] == (
        dataclasses.asdict(CFG["q1024_k1024_bh32"]), "h100")
    assert winners.lookup(URI, "h1", "h200", bucket_of(16384, 16384, 64)) == dataclasses.asdict(
        h200["q8192_k8192_bh32"])
    assert winners.lookup(URI, "h1", "h200", at("q4096_k4096_bh32")) is None  # within noise
    assert winners.lookup(URI, "h1", "h100", at("q8192_k8192_bh32")) == dataclasses.asdict(
        CFG["q8192_k8192_bh32"])
    assert winners.lookup(URI, "h1", "h100", at("q4096_k4096_bh32")) == dataclasses.asdict(
        CFG["q8192_k8192_bh32"])  # h100's nearest: 8k; h200's rows are not h100's


def test_no_database_means_defaults(db):
    assert not db.exists()
    assert winners.lookup(URI, "h1", "h100", bucket_of(1024, 1024, 32)) is None


def test_read_once_and_read_only(db):
    write(db, [(URI, "h1", "fwd", "h100", "q1024_k1024_bh32", dataclasses.asdict(CFG["q1024_k1024_bh32"]))])
    before = db.stat().st_mtime_ns, db.read_bytes()
    assert winners.lookup(URI, "h1", "h100", bucket_of(1024, 1024, 32))
    assert (db.stat().st_mtime_ns, db.read_bytes()) == before
    assert not os.path.exists(str(db) + "-wal")
    db.unlink()  # the table is in memory now: no further read
    assert winners.lookup(URI, "h1", "h100", bucket_of(1024, 1024, 32))
    winners.reset()
    assert winners.lookup(URI, "h1", "h100", bucket_of(1024, 1024, 32)) is None


def test_wal_file_where_no_shm_can_be_made(db, monkeypatch):
    """An installed package's folder is read-only: a WAL-mode file there cannot be opened with
    mode=ro (SQLite needs to create its -shm). With no -wal file beside it the file alone is the
    database and is read as immutable; with one, that would miss committed pages: an error."""
    write(db, [(URI, "h1", "fwd", "h100", "q1024_k1024_bh32", dataclasses.asdict(CFG["q1024_k1024_bh32"]))])
    con = sqlite3.connect(db)
    con.execute("PRAGMA journal_mode=WAL")
    con.close()
    real = sqlite3.connect

    def connect(database, *args, **kwargs):
        if "mode=ro" in str(database):
            raise sqlite3.OperationalError("unable to open database file")
        return real(database, *args, **kwargs)
    monkeypatch.setattr(winners.sqlite3, "connect", connect)
    assert winners.lookup(URI, "h1", "h100", bucket_of(1024, 1024, 32))
    winners.reset()
    open(str(db) + "-wal", "wb").close()
    with pytest.raises(schema.TuningDBError, match="cannot read"):
        winners.lookup(URI, "h1", "h100", bucket_of(1024, 1024, 32))


NOBODY = 65534


def _lookup_as_nobody() -> int:
    """The lookup in a forked child that dropped root for the nobody user (root may write any
    folder, so a read-only folder means nothing to it): 0 found, 1 not found, 2 raised, 3 could
    not drop root. Every module the lookup needs is already imported in the parent."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 3
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            code = 2
            winners.reset()
            code = 0 if winners.lookup(URI, "h1", "h100", bucket_of(1024, 1024, 32)) else 1
        except BaseException as e:  # noqa: BLE001 - reported through the exit status
            os.write(2, f"lookup as nobody: {type(e).__name__}: {e}\n".encode())
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@pytest.mark.parametrize("journal", ["delete", "wal"])
def test_read_only_folder(tmp_path, monkeypatch, journal):
    """A database in a folder its reader may not write (an installed package, a shared checkout)
    is read without creating -wal / -shm files beside it: packed (a rollback journal, as `attngen
    tune` leaves it) or still in WAL mode (a file copied from a run that could not pack it)."""
    root = os.geteuid() == 0
    # as root the test drops to nobody, who must be able to reach the folder: not under pytest's
    # own (0700) tmp folder
    folder = tmp_path if not root else tempfile.mkdtemp(prefix="attngen_ro_", dir="/tmp")
    path = os.path.join(folder, "attngen.sqlite")
    monkeypatch.setenv("ATTNGEN_DB", path)
    winners.reset()
    write(path, [(URI, "h1", "fwd", "h100", "q1024_k1024_bh32", dataclasses.asdict(CFG["q1024_k1024_bh32"]))])
    if journal == "wal":
        con = sqlite3.connect(path)
        assert con.execute("PRAGMA journal_mode = WAL").fetchone()[0] == "wal"
        con.close()  # the last connection checkpoints and removes -wal / -shm; the file stays WAL
    assert open(path, "rb").read(20)[18:20] == (b"\x02\x02" if journal == "wal" else b"\x01\x01")
    assert winners.lookup(URI, "h1", "h100", bucket_of(1024, 1024, 32))  # imports what it needs
    for leftover in ("-wal", "-shm"):
        if os.path.exists(path + leftover):
            os.remove(path + leftover)
    os.chmod(path, 0o444)
    os.chmod(folder, 0o555)
    try:
        if root:
            code = _lookup_as_nobody()
            if code == 3:
                pytest.skip("root here cannot switch to the nobody user (no CAP_SETUID)")
            assert code == 0
        else:
            winners.reset()
            assert winners.lookup(URI, "h1", "h100", bucket_of(1024, 1024, 32))
        assert sorted(os.listdir(folder)) == ["attngen.sqlite"]
    finally:
        os.chmod(folder, 0o755)
        winners.reset()
        if root:
            shutil.rmtree(folder)


def test_stale_template_is_ignored_with_one_warning(db):
    write(db, [(URI, "old", "fwd", "h100", "q1024_k1024_bh32", dataclasses.asdict(CFG["q1024_k1024_bh32"])),
               (URI, "old", "fwd", "h100", "q8192_k8192_bh32", dataclasses.asdict(CFG["q8192_k8192_bh32"]))])
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for _ in range(3):
            assert winners.lookup(URI, "new", "h100", bucket_of(1024, 1024, 32)) is None
    assert len(w) == 1 and "kernel hash old" in str(w[0].message) and URI in str(w[0].message)


def test_fresh_winners_serve_beside_stale_ones(db):
    write(db, [(URI, "old", "fwd", "h100", "q1024_k1024_bh32", dataclasses.asdict(FwdConfig(32, 32, 4, 1))),
               (URI, "new", "fwd", "h100", "q8192_k8192_bh32", dataclasses.asdict(CFG["q8192_k8192_bh32"]))])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # the stale 1k winner is not used, not even as the nearest: the fresh 8k one serves
        assert winners.lookup(URI, "new", "h100", bucket_of(1024, 1024, 32)) == dataclasses.asdict(CFG["q8192_k8192_bh32"])


def test_config_of_another_layout_is_ignored_with_a_warning(db):
    write(db, [(URI, "h1", "fwd", "h100", "q1024_k1024_bh32", {"block_m": 64, "gone_field": 3})])
    with pytest.warns(RuntimeWarning, match="does not fit"):
        assert winners.lookup(URI, "h1", "h100", bucket_of(1024, 1024, 32)) is None


@pytest.mark.parametrize("case, exc, match", [
    ("corrupt", schema.CorruptDatabase, "not a readable SQLite database"),
    ("other", schema.SchemaMismatch, "not an attngen tuning database"),
    ("newer", schema.SchemaMismatch, "newer attngen"),
    ("older", schema.SchemaMismatch, "attngen db migrate"),
])
def test_unusable_database_is_a_clear_error_every_time(db, case, exc, match):
    if case == "corrupt":
        db.write_bytes(b"\x00garbage" * 512)
    elif case == "other":
        con = sqlite3.connect(db)
        con.execute("CREATE TABLE t (x)")
        con.commit()
        con.close()
    else:
        write(db, [(URI, "h1", "fwd", "h100", "q1024_k1024_bh32", dataclasses.asdict(CFG["q1024_k1024_bh32"]))])
        con = sqlite3.connect(db)
        con.execute(f"UPDATE {schema.SCHEMA_VERSIONS} SET version = ?",
                    (schema.SCHEMA_VERSION + 1 if case == "newer" else 0,))
        con.commit()
        con.close()
    for _ in range(2):
        with pytest.raises(exc, match=match) as e:
            winners.lookup(URI, "h1", "h100", bucket_of(1024, 1024, 32))
        assert "\n" not in str(e.value) and str(db) in str(e.value)


def test_unreachable_url_is_a_clear_error(db, monkeypatch):
    monkeypatch.setenv("ATTNGEN_DB", "postgresql+psycopg://u:pw@127.0.0.1:9/none")
    with pytest.raises(schema.UnreachableDatabase, match="cannot connect") as e:
        winners.lookup(URI, "h1", "h100", bucket_of(1024, 1024, 32))
    assert "pw" not in str(e.value)


def test_runtime_import_is_light(db):
    """The runtime path imports neither optuna nor SQLAlchemy (the GPU machine has neither) and
    reads the default SQLite file with the stdlib."""
    write(db, [(URI, "h1", "fwd", "h100", "q1024_k1024_bh32", dataclasses.asdict(CFG["q1024_k1024_bh32"]))])
    code = ("import sys; from attngen.db import winners; from attngen.buckets import bucket_of; "
            f"assert winners.lookup({URI!r}, 'h1', 'h100', bucket_of(1024, 1024, 32)); "
            "bad = [m for m in ('optuna', 'sqlalchemy', 'jinja2') if m in sys.modules]; "
            "assert not bad, bad")
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "ATTNGEN_DB": str(db)},
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]


def test_the_runtime_serves_a_tuned_winner_and_its_warm_calls_never_read_the_database(db, monkeypatch):
    """End to end on the CPU: a winner for the kernel a call plans (its current template hash,
    device class h100) is the config the plan launches; the warm call does not look it up again."""
    import torch

    import attngen
    from attngen.runtime import api, dispatch, loader
    from attngen.spec import KernelSpec
    from attngen.problem import attention_ref, random_inputs
    from attngen.testing import assert_flash_rule
    from attngen.buckets import bucket_of

    spec = KernelSpec("fwd", "fp16", "sm90", 128, 128, 4, "causal")
    tuned = FwdConfig(32, 32, 4, 1)  # not the default table's choice for any class
    assert dispatch.family("fwd").default(spec, "cuda", 64) != tuned
    key = bucket_of(40, 40, 4).key
    write(db, [(spec.uri, loader.load(spec).KERNEL_HASH, "fwd", "h100", key, dataclasses.asdict(tuned))])
    monkeypatch.setattr(dispatch, "device_target", lambda device: "sm90")
    monkeypatch.setattr(dispatch, "device_class", lambda device, interpret: "h100")
    api.clear_plans()
    lookups = []
    real = winners.lookup
    monkeypatch.setattr(winners, "lookup", lambda *a: lookups.append(a) or real(*a))
    try:
        q, k, v = random_inputs((1, 4, 40, 128), (1, 1, 40, 128), (1, 1, 40, 128), dtype=torch.float16, seed=9)
        out = attngen.attention(q, k, v, causal=True)
        plan = next(iter(api._FWD.values()))
        assert plan.spec.uri == spec.uri and plan.config_source == "tuned" and plan.config == tuned
        assert plan.launches_spec[0].values["BLOCK_M"] == 32
        assert len(lookups) == 1
        again = attngen.attention(q, k, v, causal=True)
        assert len(lookups) == 1, "a warm call read the tuning database"
        assert torch.equal(out, again)
        ref, _ = attention_ref(q, k, v, causal=True)
        pt, _ = attention_ref(q, k, v, causal=True, upcast=False)
        assert_flash_rule("tuned config", out, ref, pt, 2.0)
    finally:
        api.clear_plans()
