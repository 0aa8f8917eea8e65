"""Every environment variable attngen reads, in one place."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


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


def tuning_db_path() -> Path:
    env = os.environ.get("ATTNGEN_TUNING_DB")
    return Path(env) if env else REPO_ROOT / "tuning_db" / "attngen.sqlite"


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
