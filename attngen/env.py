"""Every environment variable attngen reads, in one place."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIR = Path(__file__).resolve().parent


def in_checkout() -> bool:
    """Whether attngen runs from a source checkout (or an editable install of one): REPO_ROOT holds
    both specs/ and generated/. From an installed wheel REPO_ROOT is site-packages, which holds
    neither; there the package is read-only and builds go to the user cache."""
    return (REPO_ROOT / "specs").is_dir() and (REPO_ROOT / "generated").is_dir()


def default_specs_dir() -> Path | None:
    """What `attngen build` builds when given no spec files: the checkout's specs/ (None outside a
    checkout, where there is no such folder to build)."""
    return REPO_ROOT / "specs" if in_checkout() else None


def build_dir() -> Path:
    """Where `attngen build` writes when given no --out: ATTNGEN_GENERATED_DIR, else the checkout's
    generated/, else (installed package, read-only) <cache_dir()>/generated."""
    env = os.environ.get("ATTNGEN_GENERATED_DIR")
    if env:
        return Path(env)
    return REPO_ROOT / "generated" if in_checkout() else cache_dir() / "generated"


def cache_dir() -> Path:
    """Where kernels rendered on demand are written (ATTNGEN_CACHE_DIR, else the user cache)."""
    env = os.environ.get("ATTNGEN_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "attngen"


def _shipped(folder: str, package: str) -> Path:
    """The repository's folder in a checkout / editable install, else the copy the wheel carries."""
    path = REPO_ROOT / folder
    if path.is_dir():
        return path
    return Path(__file__).resolve().parent / package


def generated_dir() -> Path:
    """The built kernels (ATTNGEN_GENERATED_DIR, else generated/)."""
    env = os.environ.get("ATTNGEN_GENERATED_DIR")
    return Path(env) if env else _shipped("generated", "_generated")


def templates_dir() -> Path:
    env = os.environ.get("ATTNGEN_TEMPLATES_DIR")
    return Path(env) if env else _shipped("templates", "_templates")


def tuning_db_path(writing: bool = False) -> Path:
    """The tuning database file: ATTNGEN_TUNING_DB; in a checkout tuning_db/attngen.sqlite. An
    installed package is read-only: tuning writes <cache_dir()>/tuning_db/attngen.sqlite, and the
    runtime reads that file once it exists, else the database the wheel ships
    (attngen/_tuning_db/attngen.sqlite)."""
    env = os.environ.get("ATTNGEN_TUNING_DB")
    if env:
        return Path(env)
    if in_checkout():
        return REPO_ROOT / "tuning_db" / "attngen.sqlite"
    user = cache_dir() / "tuning_db" / "attngen.sqlite"
    if writing or user.exists():
        return user
    return PACKAGE_DIR / "_tuning_db" / "attngen.sqlite"


def tuning_db_url(writing: bool = False) -> str:
    """The tuning database as given: ATTNGEN_DB (a file path or an SQLAlchemy URL), else
    tuning_db_path(writing). attngen.db.schema.to_url turns a path into a sqlite:/// URL."""
    return os.environ.get("ATTNGEN_DB") or str(tuning_db_path(writing))


def interpreting() -> bool:
    """TRITON_INTERPRET=1: every kernel runs through Triton's interpreter (on CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def setup_interpreter() -> None:
    """On a machine with no GPU, turn Triton's interpreter on (TRITON_INTERPRET=1) unless the user
    decided already. Triton reads this when `triton.language` is first imported, so it only takes
    effect if triton was not imported before attngen."""
    import sys

    if "TRITON_INTERPRET" in os.environ or "triton" in sys.modules:
        return
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
