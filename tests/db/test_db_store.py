"""The tuning database layer: schema creation and version row, schema errors (corrupt file, another
program's database, newer and older schemas, unreachable server), the migration path, uniqueness,
the winner rule, and the JSON export / import round trip."""

from __future__ import annotations

import dataclasses
import json
import sqlite3

import pytest
from sqlalchemy import select, text
from sqlalchemy.exc import IntegrityError

from attngen.cli import main as cli
from attngen.db import migrations, schema
from attngen.db import store as dbs
from attngen.db.models import KernelModel, TrialModel, WinnerModel
from attngen.configs import FwdConfig

DEVICE = dict(device_class="h100", gpu_name="NVIDIA H200", capability="9.0", driver="570.00",
              cuda_version="12.8", torch_version="2.11.0", triton_version="3.6.0")


def _cfg(block_m: int) -> dict:
    return {"block_m": block_m, "block_n": 64, "num_warps": 4, "num_stages": 2}


def _fill(url: str, times=(2.0, 1.5, 1.7), bucket="q4096_k4096_bh64", uri="attn_fwd_x_sm90",
          failed=1) -> dict:
    """Trials with `times` (ok) and `failed` failed ones, offered as winners in order."""
    with dbs.Store(url, "create") as st, st.session() as s:
        dev = dbs.find_or_add_device(s, DEVICE)
        k = dbs.find_or_add_kernel(s, uri, "hash1", "fwd", {"family": "fwd"})
        b = dbs.find_or_add_bucket(s, bucket)
        won = []
        for i, ms in enumerate(times):
            t = dbs.add_trial(s, kernel=k, device=dev, bucket=b, config=_cfg(16 << i), status="ok",
                              shape={"seqlen_q": 4096}, time_ms=ms, tflops=300 / ms,
                              is_default=i == 0, study_name="st")
            won.append(dbs.offer_winner(s, t, "h100", times[0], 300 / times[0]))
        for j in range(failed):
            dbs.add_trial(s, kernel=k, device=dev, bucket=b, config=_cfg(999 + j), status="failed",
                          shape={}, error="OutOfResources: shared memory")
        return {"won": won, "kernel": k.id, "bucket": b.id}


def test_create_then_reopen_keeps_one_version_row(sqlite_url):
    _fill(sqlite_url)
    for mode in ("read", "write", "create"):
        with dbs.Store(sqlite_url, mode) as st:
            assert st.schema_version() == schema.SCHEMA_VERSION
    con = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))
    assert con.execute(f"SELECT count(*) FROM {schema.SCHEMA_VERSIONS}").fetchone()[0] == 1
    with pytest.raises(sqlite3.IntegrityError):  # the one-row rule is the database's, too
        con.execute(f"INSERT INTO {schema.SCHEMA_VERSIONS} VALUES (2, 1, 'x')")
    con.close()


def test_winner_rule_faster_replaces_equal_and_slower_keep(sqlite_url):
    r = _fill(sqlite_url, times=(2.0, 1.5, 1.7, 1.5, 1.2))
    assert r["won"] == [True, True, False, False, True]
    with dbs.Store(sqlite_url, "read") as st, st.session() as s:
        (w,) = dbs.where_winners(s)
        assert w.time_ms == 1.2 and w.config == _cfg(256)
        assert w.default_time_ms == 2.0 and w.gain == pytest.approx(2.0 / 1.2 - 1)


def test_failed_trials_are_rows_and_never_win(sqlite_url):
    _fill(sqlite_url, times=(2.0,), failed=2)
    with dbs.Store(sqlite_url, "write") as st, st.session() as s:
        failed = s.scalars(select(TrialModel).where(TrialModel.status == "failed")).all()
        assert len(failed) == 2 and all("OutOfResources" in t.error and t.time_ms is None for t in failed)
        with pytest.raises(ValueError, match="only ok trials can win"):
            dbs.offer_winner(s, failed[0], "h100", None, None)
        with pytest.raises(ValueError, match="needs a time"):
            dbs.add_trial(s, kernel=s.get(KernelModel, failed[0].kernel_id), device=failed[0],
                          bucket=failed[0], config={}, status="ok", shape={})


def test_unique_winner_per_kernel_class_bucket_is_the_databases_rule(sqlite_url):
    r = _fill(sqlite_url, times=(2.0,))
    with dbs.Store(sqlite_url, "write") as st:
        with pytest.raises(IntegrityError), st.session() as s:
            w = s.scalars(select(WinnerModel)).one()
            s.add(WinnerModel(kernel_id=r["kernel"], device_class="h100", bucket_id=r["bucket"],
                              trial_id=w.trial_id, config_json="{}", time_ms=0.5, updated_at=0.0))
        with st.session() as s:  # the failed transaction left nothing behind
            assert len(s.scalars(select(WinnerModel)).all()) == 1
        with pytest.raises(IntegrityError), st.session() as s:
            s.add(KernelModel(uri="attn_fwd_x_sm90", template_hash="hash1", family="fwd", spec_json="{}"))


def test_a_different_device_class_has_its_own_winner(sqlite_url):
    _fill(sqlite_url, times=(2.0,))
    with dbs.Store(sqlite_url, "write") as st, st.session() as s:
        t = s.scalars(select(TrialModel).where(TrialModel.status == "ok")).one()
        assert dbs.offer_winner(s, t, "a100", None, None)
        assert sorted(w.device_class for w in dbs.where_winners(s)) == ["a100", "h100"]


# ---- schema errors ------------------------------------------------------------------------------

def test_missing_file(tmp_path):
    with pytest.raises(schema.DatabaseMissing, match="no tuning database"):
        dbs.Store(str(tmp_path / "none.sqlite"), "read")
    assert not (tmp_path / "none.sqlite").exists()


def test_corrupt_file(tmp_path):
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"this is not an sqlite file at all" * 100)
    for mode in ("read", "write", "create"):
        with pytest.raises(schema.CorruptDatabase, match="not a readable SQLite database"):
            dbs.Store(str(bad), mode)
    assert bad.read_bytes().startswith(b"this is not")  # never overwritten


def test_another_programs_database(tmp_path):
    other = tmp_path / "other.sqlite"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE notes (x)")
    con.commit()
    con.close()
    with pytest.raises(schema.SchemaMismatch, match="not an attngen tuning database"):
        dbs.Store(str(other), "read")


def test_attngen_tables_without_version_row(sqlite_url):
    _fill(sqlite_url)
    con = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))
    con.execute(f"DROP TABLE {schema.SCHEMA_VERSIONS}")
    con.commit()
    con.close()
    with pytest.raises(schema.CorruptDatabase, match="no attngen_schema_versions"):
        dbs.Store(sqlite_url, "create")


def _set_version(url: str, v: int) -> None:
    con = sqlite3.connect(url.removeprefix("sqlite:///"))
    con.execute(f"UPDATE {schema.SCHEMA_VERSIONS} SET version = ?", (v,))
    con.commit()
    con.close()


def test_newer_schema_is_refused_by_readers_and_writers(sqlite_url):
    _fill(sqlite_url)
    _set_version(sqlite_url, schema.SCHEMA_VERSION + 1)
    for mode in ("read", "write", "create"):
        with pytest.raises(schema.SchemaMismatch, match="newer attngen"):
            dbs.Store(sqlite_url, mode)


def test_older_schema_migrates_on_write_and_is_refused_on_read(sqlite_url, monkeypatch):
    _fill(sqlite_url)
    ran = []

    def step_1_to_2(conn):
        conn.execute(text(f"ALTER TABLE {schema.TRIALS} ADD COLUMN note TEXT"))
        ran.append(1)

    monkeypatch.setattr(schema, "SCHEMA_VERSION", 2)
    with pytest.raises(schema.SchemaMismatch, match="no migration step leads from 1 to 2"):
        dbs.Store(sqlite_url, "write")
    with pytest.raises(schema.SchemaMismatch, match="attngen db migrate"):
        dbs.Store(sqlite_url, "read")

    def broken(conn):
        conn.execute(text(f"ALTER TABLE {schema.TRIALS} ADD COLUMN half TEXT"))
        raise RuntimeError("step failed half-way")

    monkeypatch.setitem(migrations.STEPS, 1, broken)
    with pytest.raises(RuntimeError, match="half-way"):
        dbs.Store(sqlite_url, "write")
    con = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))
    cols = [r[1] for r in con.execute(f"PRAGMA table_info({schema.TRIALS})")]
    assert "half" not in cols, "a failed migration step must roll back"
    assert con.execute(f"SELECT version FROM {schema.SCHEMA_VERSIONS}").fetchone()[0] == 1
    con.close()

    monkeypatch.setitem(migrations.STEPS, 1, step_1_to_2)
    with dbs.Store(sqlite_url, "write") as st:
        assert st.schema_version() == 2 and ran == [1]
    with dbs.Store(sqlite_url, "read") as st:
        assert st.schema_version() == 2


def test_unreachable_server_is_a_one_line_error():
    url = "postgresql+psycopg://u:secret@127.0.0.1:9/none"
    with pytest.raises(schema.UnreachableDatabase) as exc:
        dbs.Store(url, "read")
    msg = str(exc.value)
    assert "cannot connect" in msg and "secret" not in msg and "\n" not in msg


@pytest.mark.parametrize("case", ["corrupt", "newer", "unreachable", "missing"])
def test_cli_db_errors_exit_2_without_traceback(case, tmp_path, capsys, sqlite_url):
    if case == "corrupt":
        (tmp_path / "x.sqlite").write_text("garbage")
        storage = str(tmp_path / "x.sqlite")
    elif case == "newer":
        _fill(sqlite_url)
        _set_version(sqlite_url, 99)
        storage = sqlite_url
    elif case == "unreachable":
        storage = "postgresql+psycopg://u:p@127.0.0.1:9/none"
    else:
        storage = str(tmp_path / "none.sqlite")
    for argv in (["db", "show"], ["db", "export"], ["db", "migrate"]):
        assert cli([*argv, "--storage", storage]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"attngen {' '.join(argv)}: ") and err.count("\n") == 1, err
        assert "Traceback" not in err


# ---- export / import ----------------------------------------------------------------------------

def _export(url: str) -> dict:
    with dbs.Store(url, "read") as st, st.session() as s:
        return dbs.export_data(s)


def test_export_import_round_trip(tmp_path):
    a, b = f"sqlite:///{tmp_path / 'a.sqlite'}", f"sqlite:///{tmp_path / 'b.sqlite'}"
    _fill(a)
    _fill(a, times=(3.0, 2.5), bucket="q1024_k1024_bh32", uri="attn_bwd_x_sm90", failed=0)
    data = _export(a)
    assert len(data["trials"]) == 6 and len(data["winners"]) == 2
    with dbs.Store(b, "create") as st, st.session() as s:
        rep = dbs.import_data(s, json.loads(json.dumps(data)))
    assert (rep.trials_added, rep.winners_changed) == (6, 2)
    assert _export(b) == data
    with dbs.Store(b, "write") as st, st.session() as s:  # importing again changes nothing
        rep = dbs.import_data(s, data)
    assert (rep.trials_added, rep.trials_known, rep.winners_changed, rep.winners_kept) == (0, 6, 0, 2)
    assert _export(b) == data


def test_export_of_some_kernels_carries_only_theirs(tmp_path):
    a, b = f"sqlite:///{tmp_path / 'a.sqlite'}", f"sqlite:///{tmp_path / 'b.sqlite'}"
    _fill(a)
    _fill(a, times=(3.0, 2.5), bucket="q1024_k1024_bh32", uri="attn_bwd_x_sm90", failed=0)
    with dbs.Store(a, "read") as st, st.session() as s:
        part = dbs.export_data(s, kernels_glob="attn_bwd_*")
        assert dbs.export_data(s, kernels_glob="*") == dbs.export_data(s)
    assert [k["uri"] for k in part["kernels"]] == ["attn_bwd_x_sm90"]
    assert part["shape_buckets"] == ["q1024_k1024_bh32"] and len(part["trials"]) == 2
    assert [w["bucket"] for w in part["winners"]] == ["q1024_k1024_bh32"]
    with dbs.Store(b, "create") as st, st.session() as s:
        rep = dbs.import_data(s, part)
    assert (rep.trials_added, rep.winners_changed) == (2, 1)
    assert _export(b) == part


def test_import_merges_and_the_faster_winner_stays(tmp_path):
    a, b = f"sqlite:///{tmp_path / 'a.sqlite'}", f"sqlite:///{tmp_path / 'b.sqlite'}"
    _fill(a, times=(2.0, 1.5))
    _fill(b, times=(2.0, 1.2))  # b is faster already
    with dbs.Store(b, "write") as st, st.session() as s:
        rep = dbs.import_data(s, _export(a))
        assert rep.winners_kept == 1 and dbs.where_winners(s)[0].time_ms == 1.2
    with dbs.Store(a, "write") as st, st.session() as s:
        rep = dbs.import_data(s, _export(b))
        assert rep.winners_changed == 1 and dbs.where_winners(s)[0].time_ms == 1.2
        assert len(s.scalars(select(TrialModel)).all()) == 6  # 3 + 3, none twice


def test_bad_exports_write_nothing(tmp_path):
    a, b = f"sqlite:///{tmp_path / 'a.sqlite'}", f"sqlite:///{tmp_path / 'b.sqlite'}"
    _fill(a)
    good = _export(a)
    bad_winner = json.loads(json.dumps(good))
    bad_winner["winners"][0]["trial"] = "nope"
    failed_winner = json.loads(json.dumps(good))
    failed_uid = next(t["uid"] for t in good["trials"] if t["status"] == "failed")
    failed_winner["winners"][0]["trial"] = failed_uid
    cases = [({"format": "else"}, schema.TuningDBError, "format"),
             ({**good, "schema_version": 99}, schema.SchemaMismatch, "newer"),
             ({**good, "trials": [{"uid": "x"}]}, schema.TuningDBError, "KeyError"),
             (bad_winner, schema.TuningDBError, "not in the file"),
             (failed_winner, schema.TuningDBError, "status 'failed'")]
    dbs.Store(b, "create").close()
    for data, err, match in cases:
        with pytest.raises(err, match=match), dbs.Store(b, "write") as st, st.session() as s:
            dbs.import_data(s, data, "x.json")
        with dbs.Store(b, "read") as st, st.session() as s:
            assert not s.scalars(select(TrialModel)).all(), f"{match}: a rejected import wrote trials"


def test_cli_export_import_round_trip(tmp_path, capsys):
    a, b = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    _fill(f"sqlite:///{a}")
    assert cli(["db", "export", "--storage", str(a), "--out", str(tmp_path / "a.json")]) == 0
    assert cli(["db", "import", str(tmp_path / "a.json"), "--storage", str(b)]) == 0
    assert cli(["db", "export", "--storage", str(b), "--out", str(tmp_path / "b.json")]) == 0
    assert (tmp_path / "a.json").read_text() == (tmp_path / "b.json").read_text()
    assert not (tmp_path / "b.sqlite-wal").exists()  # packed: the file alone is the database
    capsys.readouterr()
    assert cli(["db", "show", "--storage", str(b)]) == 0
    out = capsys.readouterr().out
    assert "attn_fwd_x_sm90" in out and "q4096_k4096_bh64" in out and "+33.3%" in out
    assert "hash1 stale" in out  # tuned on templates other than the current ones


def test_cli_show_marks_only_stale_winners(tmp_path, capsys):
    from attngen.codegen.naming import kernel_hash
    from attngen.codegen.render import render
    from attngen.spec import KernelSpec

    db = tmp_path / "a.sqlite"
    _fill(f"sqlite:///{db}", uri="attn_fwd_old_sm90")
    ks = KernelSpec(family="fwd", dtype="bf16", target="sm90", head_dim_qk=128, head_dim_v=128, gqa_ratio=4,
                    mask="causal", softcap=False, varlen=False)
    current = kernel_hash(render(ks))  # the generated module's KERNEL_HASH
    with dbs.Store(str(db), "write") as st, st.session() as s:
        dev = dbs.find_or_add_device(s, DEVICE)
        k = dbs.find_or_add_kernel(s, ks.uri, current, "fwd", ks.as_dict())
        b = dbs.find_or_add_bucket(s, "q4096_k4096_bh64")
        t = dbs.add_trial(s, kernel=k, device=dev, bucket=b, config=_cfg(32), status="ok", shape={},
                          time_ms=1.0, tflops=300.0, is_default=True, study_name="st2")
        assert dbs.offer_winner(s, t, "h100", 1.0, 300.0)
    capsys.readouterr()
    assert cli(["db", "show", "--storage", str(db)]) == 0
    lines = capsys.readouterr().out.splitlines()
    old = next(ln for ln in lines if "attn_fwd_old_sm90" in ln)
    new = next(ln for ln in lines if ks.uri in ln)
    assert "hash1 stale" in old and current in new and "stale" not in new
    assert "300.0 TFLOP/s" in new  # each row in its family's unit (decode: GB/s)
    (tmp_path / "junk.json").write_text("{")
    assert cli(["db", "import", str(tmp_path / "junk.json"), "--storage", str(b)]) == 2
    assert "not JSON" in capsys.readouterr().err


def test_store_on_postgresql(pg_url):
    r = _fill(pg_url, times=(2.0, 1.5, 1.7, 1.5, 1.2))
    assert r["won"] == [True, True, False, False, True]
    data = _export(pg_url)
    with dbs.Store(pg_url, "write") as st, st.session() as s:
        assert dbs.import_data(s, data).trials_added == 0
    assert _export(pg_url) == data


def test_runtime_reads_winners_from_postgresql(pg_url, monkeypatch):
    from attngen.db import winners
    from attngen.buckets import bucket_of

    _fill(pg_url, times=(2.0, 1.5))
    monkeypatch.setenv("ATTNGEN_DB", pg_url)
    winners.reset()
    try:
        assert winners.lookup("attn_fwd_x_sm90", "hash1", "h100", bucket_of(8192, 8192, 64)) == dataclasses.asdict(FwdConfig(**_cfg(32)))
        assert winners.lookup("attn_fwd_x_sm90", "hash1", "a100", bucket_of(8192, 8192, 64)) is None
    finally:
        winners.reset()
