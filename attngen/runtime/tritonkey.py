"""Triton's own cache key, remembered between processes.

Every Triton cache lookup (a compiled kernel found on disk or in a loaded pack included) starts
with `triton.runtime.cache.triton_key()`: Triton's version plus sha256 hashes of its compiler,
backends, language and `libtriton` (hundreds of MB). It is computed once per process and costs
0.37 s on the H100 machine, most of a packed first call. The files it reads change only when
Triton is reinstalled, so attngen keeps the key in `<cache_dir()>/triton_key.json` beside a
fingerprint of those files (relative path, size and mtime of every `.py` and `libtriton.*` under
Triton's package, a superset of what the key reads: the test Python itself uses to trust a .pyc),
and hands Triton the kept key while the fingerprint matches. Any change to those files, a missing
or unreadable record, or a record for another Triton gives the real computation (and a new
record). ATTNGEN_TRITON_KEY_CACHE=0 turns this off.

A pack carries the record of the process that wrote it (`record()`); loading it seeds this
machine's record (`seed()`) where the fingerprints match, as they do on the machine or image the
pack was built on, so that a fresh process with a pack hashes nothing either.

Installed by `install()`, which the runtime calls before it first loads a kernel module or a pack;
nothing under Triton's interpreter (which compiles nothing).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from .. import env

RECORD = "triton_key.json"
_VERSION = 1  # of the record's layout


def fingerprint(root: str | Path) -> str:
    """sha256 over (relative path, size, mtime) of every .py and libtriton.* file under `root`,
    in a fixed order (bytecode caches left out)."""
    root = str(root)
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if not (name.endswith(".py") or name.startswith("libtriton.")):
                continue
            path = os.path.join(dirpath, name)
            st = os.stat(path)
            h.update(f"{os.path.relpath(path, root)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _valid(kept, fp: str, version: str) -> bool:
    return (isinstance(kept, dict) and kept.get("layout") == _VERSION and kept.get("fingerprint") == fp
            and kept.get("version") == version and isinstance(kept.get("key"), str)
            and kept["key"].startswith(version))


def _read(record: Path):
    try:
        return json.loads(Path(record).read_text())
    except (OSError, ValueError):
        return None


def _write(record: Path, data: dict) -> None:
    """Atomically (a temporary file, then renamed); a write that fails is ignored."""
    try:
        record = Path(record)
        record.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=record.parent, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh)
        os.replace(tmp, record)
    except OSError:
        pass


def remembered(compute: Callable[[], str], root: str | Path, version: str, record: Path) -> str:
    """The key `compute()` gives, from `record` where its fingerprint of `root` and `version` match
    this install's, else computed and written to `record`."""
    fp = fingerprint(root)
    kept = _read(record)
    if _valid(kept, fp, version):
        return kept["key"]
    key = compute()
    _write(record, {"layout": _VERSION, "version": version, "fingerprint": fp, "key": key})
    return key


def seed_record(candidate, root: str | Path, version: str, record: Path) -> bool:
    """Write `candidate` (another process's record, from a pack) to `record` where it is valid for
    this install and `record` is not; returns whether `record` now holds a valid key."""
    fp = fingerprint(root)
    if _valid(_read(record), fp, version):
        return True
    if not _valid(candidate, fp, version):
        return False
    _write(record, {k: candidate[k] for k in ("layout", "version", "fingerprint", "key")})
    return _valid(_read(record), fp, version)


def _triton_root() -> Path:
    import triton.runtime.cache as cache

    return Path(cache.__file__).resolve().parent.parent  # the triton package


def enabled() -> bool:
    return env.triton_key_cache() and not env.interpreting()


def install() -> bool:
    """Hand Triton's cache lookups the remembered key (once per process). Returns whether the
    remembered key is in place."""
    if not enabled():
        return False
    import triton
    import triton.runtime.autotuner as autotuner
    import triton.runtime.cache as cache

    if getattr(cache.triton_key, "_attngen_remembered", False):
        return True
    original = cache.triton_key
    root = _triton_root()

    @functools.lru_cache(maxsize=None)
    def triton_key() -> str:
        return remembered(original, root, triton.__version__, env.cache_dir() / RECORD)

    triton_key._attngen_remembered = True
    triton_key.original = original
    cache.triton_key = triton_key  # get_cache_key() reads the module's name at each call
    if getattr(autotuner, "triton_key", None) is original:
        autotuner.triton_key = triton_key
    return True


def record() -> dict | None:
    """This process's record (Triton's key and the fingerprint it holds for), for a pack to carry;
    None when the key is not remembered (switched off, interpreter)."""
    if not install():
        return None
    import triton
    import triton.runtime.cache as cache

    return {"layout": _VERSION, "version": triton.__version__, "fingerprint": fingerprint(_triton_root()),
            "key": cache.triton_key()}


def seed(candidate) -> bool:
    """Make `candidate` (a pack's record) this machine's record where it holds for this Triton
    install, before the key is first needed; returns whether a valid record is in place. Never
    raises."""
    if not enabled() or not candidate:
        return False
    try:
        import triton

        return seed_record(candidate, _triton_root(), triton.__version__, env.cache_dir() / RECORD)
    except Exception:  # a broken record or Triton install: the key is then computed as usual
        return False
