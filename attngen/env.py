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


def generated_dirs() -> list[Path]:
    """Where the runtime looks for built kernels, in order: ATTNGEN_GENERATED_DIR alone when set;
    else, for an installed package, what `attngen build` wrote into <cache_dir()>/generated, then
    the kernels the wheel ships; in a checkout its generated/."""
    if os.environ.get("ATTNGEN_GENERATED_DIR") or in_checkout():
        return [generated_dir()]
    return [cache_dir() / "generated", generated_dir()]


def specs_dir() -> Path:
    """The shipped spec files: the checkout's specs/, else the copy the wheel carries
    (attngen/_specs); what `attngen tune` tunes when given no --spec."""
    return _shipped("specs", "_specs")


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
    user = user_tuning_db_path()
    if writing or user.exists():
        return user
    return PACKAGE_DIR / "_tuning_db" / "attngen.sqlite"


def user_tuning_db_path() -> Path:
    """The user's own tuning database: <cache_dir()>/tuning_db/attngen.sqlite."""
    return cache_dir() / "tuning_db" / "attngen.sqlite"


def tuning_db_url(writing: bool = False) -> str:
    """The tuning database as given: ATTNGEN_DB (a file path or an SQLAlchemy URL), else
    tuning_db_path(writing). attngen.db.schema.to_url turns a path into a sqlite:/// URL."""
    return os.environ.get("ATTNGEN_DB") or str(tuning_db_path(writing))


def shipped_tuning_db_path() -> Path:
    """The database of winners attngen ships: the checkout's tuning_db/attngen.sqlite, else the
    wheel's copy (attngen/_tuning_db/attngen.sqlite)."""
    return _shipped("tuning_db", "_tuning_db") / "attngen.sqlite"


def tuning_db_layers() -> list[tuple[str, str]]:
    """The tuning databases the runtime reads, as (origin, location), the first that holds a
    winner for a (kernel, device class, shape bucket) serving it. ATTNGEN_DB names the one database
    to read, alone ("ATTNGEN_DB"). Else the user's database (ATTNGEN_TUNING_DB, or for an installed
    package <cache_dir()>/tuning_db/attngen.sqlite, where `attngen tune` and `attngen db import`
    write) overlays the shipped one: ("user", ...), ("shipped", ...). In a checkout with neither
    variable set the two are one file, tuning_db/attngen.sqlite ("shipped")."""
    given = os.environ.get("ATTNGEN_DB")
    if given:
        return [("ATTNGEN_DB", given)]
    shipped = shipped_tuning_db_path()
    user = os.environ.get("ATTNGEN_TUNING_DB") or (None if in_checkout() else str(user_tuning_db_path()))
    layers = [("user", user)] if user and Path(user).resolve() != shipped.resolve() else []
    return [*layers, ("shipped", str(shipped))]


def pack_paths() -> list[Path]:
    """Compiled-kernel packs the runtime loads before its first kernel (attngen.runtime.packs):
    the files ATTNGEN_PACKS names (separated by os.pathsep, `:` on Linux), then the packs shipped
    in the package (shipped_packs())."""
    given = [Path(p) for p in os.environ.get("ATTNGEN_PACKS", "").split(os.pathsep) if p]
    return [*given, *shipped_packs()]


def shipped_packs() -> list[Path]:
    """The packs shipped in the package (attngen/packs/*.pack, name order); none with
    ATTNGEN_SHIPPED_PACKS=0."""
    shipped = PACKAGE_DIR / "packs"
    if os.environ.get("ATTNGEN_SHIPPED_PACKS", "1") == "0" or not shipped.is_dir():
        return []
    return sorted(shipped.glob("*.pack"))


def triton_key_cache() -> bool:
    """ATTNGEN_TRITON_KEY_CACHE (default 1): keep Triton's cache key across processes in
    <cache_dir()>/triton_key.json while Triton's files are unchanged (attngen.runtime.tritonkey);
    0: every process hashes Triton's files, as Triton does."""
    return os.environ.get("ATTNGEN_TRITON_KEY_CACHE", "1") != "0"


# os.environ's own mapping (POSIX: encoded names and values; os.environ[...] = and del update it):
# a warm decode call reads ATTNGEN_CHECK_KVCACHE every time, and os.environ.get encodes the name and
# decodes the value each call (about 2 µs, a tenth of the call's host time)
_ENVIRON = getattr(os.environ, "_data", None)
_CHECK_KVCACHE = (os.environ.encodekey("ATTNGEN_CHECK_KVCACHE"), os.environ.encodevalue("1")) \
    if _ENVIRON is not None and hasattr(os.environ, "encodekey") else None


def check_kvcache() -> bool:
    """ATTNGEN_CHECK_KVCACHE=1: attention_with_kvcache checks cache_seqlens and block_table values
    on the host before every launch (a device-to-host copy: for debugging; as validate=True)."""
    if _CHECK_KVCACHE is not None:
        return _ENVIRON.get(_CHECK_KVCACHE[0]) == _CHECK_KVCACHE[1]
    return os.environ.get("ATTNGEN_CHECK_KVCACHE", "0") == "1"


def kernel_descriptors() -> bool:
    """ATTNGEN_KERNEL_DESCRIPTORS=0: no kernel that makes TMA descriptors in the kernel (the Gluon
    backward over packed documents, the paged prefill's copy-engine K / V); their calls take the
    Triton passes and the pointer gather instead (runtime.dispatch.select_config). Those kernels
    faulted with several processes sharing one GPU (docs/runtime.md, "Processes sharing a GPU").
    Read when a plan is made: set it before the first call."""
    return os.environ.get("ATTNGEN_KERNEL_DESCRIPTORS", "1") != "0"


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
