"""attngen.env: the one "are we in a source checkout?" decision, and where builds go from it."""

from __future__ import annotations

from pathlib import Path

import pytest

from attngen import env


@pytest.fixture
def fake_root(tmp_path, monkeypatch) -> Path:
    monkeypatch.setattr(env, "REPO_ROOT", tmp_path)
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ATTNGEN_GENERATED_DIR", raising=False)
    return tmp_path


def test_this_repository_is_a_checkout():
    assert env.in_checkout() is True
    assert env.default_specs_dir() == env.REPO_ROOT / "specs"


def test_a_wheel_layout_is_not_a_checkout(fake_root):
    """From a wheel REPO_ROOT is site-packages: attngen/ is there, specs/ and generated/ are not."""
    (fake_root / "attngen").mkdir()
    assert env.in_checkout() is False
    assert env.default_specs_dir() is None
    assert env.build_dir() == fake_root / "cache" / "generated"
    (fake_root / "specs").mkdir()  # one of the two is not enough
    assert env.in_checkout() is False
    (fake_root / "generated").mkdir()
    assert env.in_checkout() is True
    assert env.default_specs_dir() == fake_root / "specs"
    assert env.build_dir() == fake_root / "generated"


def test_generated_dir_variable_wins_for_builds(fake_root, monkeypatch):
    monkeypatch.setenv("ATTNGEN_GENERATED_DIR", str(fake_root / "mine"))
    assert env.build_dir() == fake_root / "mine"
    (fake_root / "specs").mkdir()
    (fake_root / "generated").mkdir()
    assert env.build_dir() == fake_root / "mine"


def test_tuning_db_outside_a_checkout_is_read_from_the_wheel_and_written_to_the_cache(fake_root, monkeypatch):
    """An installed package never writes its shipped database: tuning goes to the user cache, and
    the runtime reads the user's database once it exists, else the shipped one."""
    monkeypatch.delenv("ATTNGEN_TUNING_DB", raising=False)
    monkeypatch.delenv("ATTNGEN_DB", raising=False)
    (fake_root / "attngen").mkdir()
    shipped = env.PACKAGE_DIR / "_tuning_db" / "attngen.sqlite"
    user = fake_root / "cache" / "tuning_db" / "attngen.sqlite"
    assert env.tuning_db_path() == shipped
    assert env.tuning_db_path(writing=True) == user
    user.parent.mkdir(parents=True)
    user.write_bytes(b"")
    assert env.tuning_db_path() == user


def test_tuning_db_in_a_checkout_is_the_repository_file(monkeypatch):
    monkeypatch.delenv("ATTNGEN_TUNING_DB", raising=False)
    assert env.tuning_db_path() == env.tuning_db_path(writing=True) == env.REPO_ROOT / "tuning_db" / "attngen.sqlite"
