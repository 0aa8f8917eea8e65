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



def test_the_tests_never_touch_the_users_cache():
    """tests/conftest.py points ATTNGEN_CACHE_DIR at a temporary folder before attngen is imported,
    and a kernel nobody built is rendered there."""
    import os
    import tempfile

    from attngen.runtime import loader
    from attngen.spec import KernelSpec

    cache = env.cache_dir().resolve()
    assert os.environ["ATTNGEN_CACHE_DIR"] and cache == Path(os.environ["ATTNGEN_CACHE_DIR"]).resolve()
    assert cache.is_relative_to(Path(tempfile.gettempdir()).resolve()), cache
    assert not cache.is_relative_to((Path.home() / ".cache").resolve()), cache
    mod = loader.load(KernelSpec("fwd", "fp16", "sm80", 24, 24, 3, "none"))  # in no spec file
    assert Path(mod.__file__).resolve().is_relative_to(cache), mod.__file__


def test_an_installed_attngen_tunes_the_specs_its_wheel_carries(fake_root):
    """Outside a checkout the shipped specs are attngen/_specs, which pyproject.toml fills from
    specs/: `attngen tune` without --spec tunes them."""
    tomllib = pytest.importorskip("tomllib")
    from attngen.tuning.targets import TuneError, TuneOptions, plan

    assert env.specs_dir() == Path(env.__file__).resolve().parent / "_specs"
    with open(Path(__file__).resolve().parent.parent / "pyproject.toml", "rb") as fh:
        tool = tomllib.load(fh)["tool"]["setuptools"]
    assert tool["package-dir"]["attngen._specs"] == "specs" and "attngen._specs" in tool["packages"]
    assert tool["package-data"]["attngen._specs"] == ["*.yaml"]
    with pytest.raises(TuneError, match="_specs"):  # no wheel was built here: the error names the path
        plan(TuneOptions(device="h100"))


@pytest.mark.parametrize("value, want", [(None, False), ("1", True), ("0", False), ("true", False), ("", False)])
def test_check_kvcache_follows_os_environ_as_it_changes(monkeypatch, value, want):
    """The decode fast path reads ATTNGEN_CHECK_KVCACHE through os.environ's own mapping: a value
    set or removed while the process runs is what the next call sees."""
    monkeypatch.setenv("ATTNGEN_CHECK_KVCACHE", "1")
    assert env.check_kvcache() is True
    if value is None:
        monkeypatch.delenv("ATTNGEN_CHECK_KVCACHE")
    else:
        monkeypatch.setenv("ATTNGEN_CHECK_KVCACHE", value)
    assert env.check_kvcache() is want
