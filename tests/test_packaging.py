"""The wheel lists its packages by hand (pyproject.toml [tool.setuptools] packages): every package
folder of attngen/ must be in that list, or a non-editable install lacks it (an editable install,
which the tests run from, would never notice)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from attngen.env import REPO_ROOT

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11


def package_inits() -> list[Path]:
    """attngen's __init__.py files: those git tracks (a folder still being written, not yet
    committed, is not part of the package yet), or every one when this is no git checkout."""
    try:
        res = subprocess.run(["git", "ls-files", "--", "attngen/**/__init__.py", "attngen/__init__.py"],
                             cwd=REPO_ROOT, capture_output=True, text=True, timeout=30)
    except OSError:
        res = None
    if res is not None and res.returncode == 0 and res.stdout.strip():
        return [REPO_ROOT / line for line in res.stdout.split()]
    return sorted((REPO_ROOT / "attngen").rglob("__init__.py"))


def test_every_package_folder_ships_in_the_wheel():
    with open(REPO_ROOT / "pyproject.toml", "rb") as fh:
        listed = set(tomllib.load(fh)["tool"]["setuptools"]["packages"])
    folders = {".".join(p.parent.relative_to(REPO_ROOT).parts) for p in package_inits()}
    assert {"attngen", "attngen.codegen"} <= folders, folders
    missing = sorted(folders - listed)
    assert not missing, f"pyproject.toml [tool.setuptools] packages lacks {missing}: the wheel would too"
