"""Compiled-kernel packs: Triton cache entries built ahead of time (`attngen warmup --pack`,
attngen.runtime.packwrite) and placed into this process's Triton cache before its first compile,
so that Triton's own cache lookup finds them: a kernel whose entry is in a pack runs without
ptxas, and its C launcher without a C compiler.

A pack is one zip file: `manifest.json` first, then `entries/<cache folder>/<file>` for each
entry's files, in name order. An entry is one folder of Triton's file cache, as Triton names it
(the base32 of a sha256 key):
- kind "kernel": a compiled kernel's cubin and metadata JSON (what TRITON_STORE_BINARY_ONLY keeps);
  loading writes Triton's group file (`__grp__<name>.json`, which lists the entry's files by their
  paths in this cache) last, so Triton sees the entry only once it is whole;
- kind "c_module": a shared object Triton builds from C with a C compiler: a kernel's launcher
  (`__triton_launcher`) or the driver's utilities (`cuda_utils`).

Triton's keys already hold what makes a binary fit (for kernels triton_key(), the source, ptxas's
version, the GPU architecture and the TRITON_* variables that change a compile; for C modules the
C source and the platform, the Python ABI in the file name), so a stale entry would never be hit.
Loading still checks each entry explicitly (Triton version and triton_key, GPU architecture, ptxas
version, those TRITON_* variables, the launcher's Python ABI) and skips a mismatch with its
reason, and reads nothing but regular files with safe names, each checked against its sha256 and
written under a temporary name, then renamed.

The runtime loads ATTNGEN_PACKS and the packs shipped in attngen/packs/ once, when it first loads
a kernel module (autoload; attngen.runtime.loader), before anything can compile.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import stat
import sys
import sysconfig
import time
import uuid
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from attngen import env
from attngen.runtime import tritonkey

FORMAT = "attngen-pack"
VERSION = 1
MANIFEST = "manifest.json"
GROUP_PREFIX = "__grp__"  # Triton's group file: <prefix><metadata file name>
ENTRY_DIR = re.compile(r"[A-Z2-7]{52}")  # a Triton cache folder: base32 of a sha256, unpadded
FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+\-]{0,199}")  # no separator, no leading dot
MAX_FILE = 256 << 20  # bytes of one entry file at most (a cubin is tens to hundreds of KiB)
KINDS = ("kernel", "c_module")


class PackError(Exception):
    """A pack (or one of its entries) that cannot be read as a pack."""


def member(folder: str, name: str) -> str:
    """The archive member of entry file `name` in cache folder `folder`."""
    return f"entries/{folder}/{name}"


@dataclass
class PackReport:
    """What load_pack did: entries written into the cache (taken), entries already there
    (present), entries left out with the reason (skipped); error: the pack could not be read."""

    path: str
    cache_dir: str | None = None
    taken: list[str] = field(default_factory=list)
    present: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return {"path": self.path, "cache_dir": self.cache_dir, "taken": self.taken, "present": self.present,
                "skipped": [{"entry": e, "reason": r} for e, r in self.skipped], "error": self.error,
                "seconds": round(self.seconds, 4)}

    def __str__(self) -> str:
        if self.error:
            return f"pack {self.path}: not loaded: {self.error}"
        lines = [f"pack {self.path} -> {self.cache_dir}: {len(self.taken)} taken, {len(self.present)} "
                 f"already present, {len(self.skipped)} skipped ({self.seconds:.3f} s)"]
        lines += [f"  skipped {e}: {r}" for e, r in self.skipped]
        return "\n".join(lines)


def triton_key_digest() -> str:
    """sha256 of triton_key(): Triton's version and the hashes of its compiler, backends, language
    and libtriton (hashing them takes about 0.4 s; runtime.tritonkey keeps the key across
    processes, and Triton's first cache lookup, a hit included, needs the same key)."""
    from . import tritonkey

    tritonkey.install()  # the key remembered across processes where Triton's files are unchanged
    from triton.runtime.cache import triton_key

    return hashlib.sha256(triton_key().encode()).hexdigest()


def ptxas_version(arch: int) -> str:
    """What the ptxas Triton uses for `arch` prints for --version (part of Triton's key)."""
    from triton.backends.nvidia.compiler import get_ptxas_version

    return get_ptxas_version(arch).strip()


def compile_settings() -> dict:
    """The TRITON_* variables set in this process that change what Triton compiles (Triton's
    get_cache_invalidating_env_vars(): debugging and dump switches, line info, ...; in its key)."""
    from triton._C.libtriton import get_cache_invalidating_env_vars

    return dict(sorted(get_cache_invalidating_env_vars().items()))


def launcher_abi() -> dict:
    """What a C module Triton builds depends on besides its source: the Python it is built for
    (its EXT_SUFFIX is in the file name) and the platform (in its key)."""
    from triton.runtime.build import platform_key

    return {"python": f"{sys.version_info.major}.{sys.version_info.minor}",
            "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX"), "platform": platform_key()}


def visible_archs() -> frozenset[int]:
    """The compute capabilities (major * 10 + minor, as Triton's targets) of the visible GPUs."""
    import torch

    if not torch.cuda.is_available():
        return frozenset()
    return frozenset(a * 10 + b for a, b in (torch.cuda.get_device_capability(i)
                                               for i in range(torch.cuda.device_count())))


class Environment:
    """This process's side of each check, each part computed on first use."""

    def __init__(self, archs=None):
        self._archs = None if archs is None else frozenset(archs)

    @functools.cached_property
    def triton_version(self) -> str:
        import triton

        return triton.__version__

    @functools.cached_property
    def triton_key(self) -> str:
        return triton_key_digest()

    @functools.cached_property
    def archs(self) -> frozenset[int]:
        return visible_archs() if self._archs is None else self._archs

    @functools.cached_property
    def abi(self) -> dict:
        return launcher_abi()

    @functools.cached_property
    def settings(self) -> dict:
        return compile_settings()

    def ptxas(self, arch: int) -> str:
        return ptxas_version(arch)  # Triton keeps each answer


def _release(version: str) -> str:
    """The line of ptxas --version that names the release (the whole text when none does)."""
    return next((line.strip() for line in str(version).splitlines() if "release" in line), str(version))


def mismatch(entry: dict, here: Environment) -> str | None:
    """Why `entry` does not fit this process (None: it fits)."""
    kind = entry.get("kind")
    if kind not in KINDS:
        return f"unknown entry kind {kind!r}"
    if entry.get("triton_version") != here.triton_version:
        return f"built by Triton {entry.get('triton_version')}; this process runs Triton {here.triton_version}"
    if entry.get("triton_key") != here.triton_key:
        return f"built by another build of Triton {here.triton_version} (its triton_key() differs)"
    if kind == "c_module":
        abi = entry.get("abi") or {}
        for part in ("python", "ext_suffix", "platform"):
            if abi.get(part) != here.abi[part]:
                return f"a C module for {part} {abi.get(part)!r}; this process has {here.abi[part]!r}"
        return None
    target = entry.get("target") or {}
    arch = target.get("arch")
    if target.get("backend") != "cuda" or not isinstance(arch, int):
        return f"built for target {target!r}; packs hold CUDA kernels"
    if arch not in here.archs:
        gpus = ", ".join(f"sm{a}" for a in sorted(here.archs)) or "none visible"
        return f"built for sm{arch}; this machine's GPUs: {gpus}"
    if entry.get("ptxas") != here.ptxas(arch):
        return (f"built with ptxas {_release(entry.get('ptxas'))!r}; this Triton's ptxas for sm{arch} is "
                f"{_release(here.ptxas(arch))!r}")
    if (entry.get("triton_settings") or {}) != here.settings:
        return (f"compiled with Triton settings {entry.get('triton_settings') or {}}; this process has "
                f"{here.settings}")
    return None


def unsafe(entry: dict) -> str | None:
    """Why `entry`'s names or file records cannot be placed safely (None: they can): its folder
    must be a Triton cache folder name and each file a plain name (no separator, no leading dot,
    not a group or lock file), a kernel's group one of its files."""
    folder = entry.get("dir")
    if not isinstance(folder, str) or not ENTRY_DIR.fullmatch(folder):
        return f"unsafe or malformed cache folder name {folder!r}"
    files = entry.get("files")
    if not isinstance(files, list) or not files:
        return "no files"
    names = []
    for rec in files:
        name = rec.get("name") if isinstance(rec, dict) else None
        if (not isinstance(name, str) or not FILE_NAME.fullmatch(name) or name.startswith(GROUP_PREFIX)
                or name == "lock"):
            return f"unsafe file name {name!r}"
        size = rec.get("size")
        if not isinstance(rec.get("sha256"), str) or not isinstance(size, int) or not 0 <= size <= MAX_FILE:
            return f"malformed file record for {name!r}"
        names.append(name)
    if len(set(names)) != len(names):
        return "a file named twice"
    if entry.get("kind") == "kernel" and (entry.get("group") not in names or not entry["group"].endswith(".json")):
        return f"kernel metadata {entry.get('group')!r} is not one of its files"
    return None


def label(entry: dict) -> str:
    """How reports name an entry: kind, name, the attngen kernel (if known) and target, folder."""
    folder = str(entry.get("dir"))[:12]
    if entry.get("kind") == "kernel":
        uri = (entry.get("kernel") or {}).get("uri")
        arch = (entry.get("target") or {}).get("arch")
        return f"kernel {entry.get('name')}{f' [{uri}]' if uri else ''} sm{arch} {folder}"
    return f"{entry.get('kind')} {entry.get('name')} {folder}"


def read_manifest(zf: zipfile.ZipFile) -> dict:
    try:
        manifest = json.loads(zf.read(MANIFEST))
    except KeyError:
        raise PackError(f"no {MANIFEST}: not an attngen pack") from None
    except ValueError as exc:
        raise PackError(f"{MANIFEST} is not JSON: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise PackError(f"{MANIFEST} is not an attngen pack's (format {FORMAT!r})")
    if manifest.get("version") != VERSION:
        raise PackError(f"pack format version {manifest.get('version')!r}; this attngen reads version {VERSION}")
    entries = manifest.get("entries")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise PackError(f"{MANIFEST}: entries is not a list of records")
    return manifest


def triton_cache_dir() -> Path:
    """The folder Triton's file cache uses in this process (TRITON_CACHE_DIR, else Triton's
    default, ~/.triton/cache)."""
    from triton import knobs

    if knobs.cache.manager_class is not None:
        raise PackError("TRITON_CACHE_MANAGER names a cache manager of its own; packs fill Triton's file "
                        "cache (knobs.cache.dir) only")
    if not knobs.cache.dir:
        raise PackError("Triton has no cache folder (knobs.cache.dir is empty)")
    return Path(knobs.cache.dir)


def _regular(info: zipfile.ZipInfo) -> bool:
    mode = info.external_attr >> 16
    return not info.is_dir() and (mode == 0 or stat.S_ISREG(mode))


def _write(path: Path, data: bytes) -> None:
    """`data` into `path` under a temporary name in the same folder, then renamed (atomic)."""
    tmp = path.with_name(f".tmp.pack.{os.getpid()}.{uuid.uuid4().hex}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _complete(folder: Path, entry: dict) -> bool:
    """Whether the cache already holds `entry` whole, as Triton finds it."""
    files = {rec["name"]: rec["size"] for rec in entry["files"]}
    if entry["kind"] == "c_module":
        return all((folder / n).is_file() and (folder / n).stat().st_size == s for n, s in files.items())
    try:
        children = json.loads((folder / f"{GROUP_PREFIX}{entry['group']}").read_text())["child_paths"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return all(Path(str(children.get(n))) == folder / n and (folder / n).is_file() for n in files)


def _place(zf: zipfile.ZipFile, entry: dict, cache: Path) -> str:
    """Write `entry` into the cache folder `cache`: "taken", or "present" when it is there already.
    Every file is read and checked before anything is written; a kernel's group file comes last."""
    folder = cache / entry["dir"]
    if _complete(folder, entry):
        return "present"
    blobs = {}
    for rec in entry["files"]:
        try:
            info = zf.getinfo(member(entry["dir"], rec["name"]))
        except KeyError:
            raise PackError(f"{rec['name']}: no such member in the archive") from None
        if not _regular(info):
            raise PackError(f"{rec['name']}: not a regular file in the archive")
        if info.file_size != rec["size"]:
            raise PackError(f"{rec['name']}: {info.file_size} bytes in the archive, {rec['size']} in the manifest")
        data = zf.read(info)
        if hashlib.sha256(data).hexdigest() != rec["sha256"]:
            raise PackError(f"{rec['name']}: content does not match its sha256 in the manifest")
        blobs[rec["name"]] = data
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in blobs.items():
        _write(folder / name, data)
    if entry["kind"] == "kernel":
        group = {"child_paths": {name: str(folder / name) for name in blobs}}
        _write(folder / f"{GROUP_PREFIX}{entry['group']}", json.dumps(group).encode())
    return "taken"


def load_pack(path, *, cache_dir=None, archs=None) -> PackReport:
    """Place the entries of the pack at `path` that fit this process into Triton's cache folder
    (`cache_dir`, default: the one this process's Triton uses), before they are compiled; returns
    what it took, found present and skipped, and why. `archs`: the GPU architectures to accept
    (e.g. {90}); default: those of the visible GPUs. Never raises for a bad pack or entry: the
    report says."""
    t0 = time.perf_counter()
    report = PackReport(str(path))
    try:
        with zipfile.ZipFile(path) as zf:
            manifest = read_manifest(zf)
            # where the pack was built on this Triton install (same files, same times), its record
            # of Triton's key spares this process hashing Triton's files (runtime.tritonkey)
            tritonkey.seed(manifest.get("triton_key_record"))
            cache = Path(cache_dir) if cache_dir is not None else triton_cache_dir()
            report.cache_dir = str(cache)
            here = Environment(archs)
            for entry in manifest["entries"]:
                name = label(entry)
                why = unsafe(entry) or mismatch(entry, here)
                if why is None:
                    try:
                        taken = _place(zf, entry, cache) == "taken"
                    except PackError as exc:
                        why = str(exc)
                if why is not None:
                    report.skipped.append((name, why))
                else:
                    (report.taken if taken else report.present).append(name)
    except (OSError, zipfile.BadZipFile, PackError) as exc:
        report.error = str(exc) or type(exc).__name__
    report.seconds = time.perf_counter() - t0
    return report


_AUTO: list[PackReport] | None = None


def autoload() -> None:
    """Load the packs ATTNGEN_PACKS names and those shipped in attngen/packs/, once per process
    (the runtime calls this when it first loads a kernel module). Nothing under Triton's
    interpreter, which compiles nothing. A pack that cannot be read, or one named in
    ATTNGEN_PACKS none of whose entries fit, gives a warning; loaded() has the reports."""
    global _AUTO
    if _AUTO is not None:
        return
    _AUTO = []
    if env.interpreting():
        return
    shipped = env.PACKAGE_DIR / "packs"
    for path in env.pack_paths():
        try:
            report = load_pack(path)
        except Exception as exc:  # a broken Triton install, a ptxas that does not run: never fatal here
            report = PackReport(str(path), error=f"{type(exc).__name__}: {exc}")
        _AUTO.append(report)
        if report.error:
            warnings.warn(f"attngen: {report}", RuntimeWarning, stacklevel=2)
        elif report.skipped and not (report.taken or report.present) and path.parent != shipped:
            warnings.warn(f"attngen: none of the entries of {report.path} fit this process "
                          f"(first: {report.skipped[0][1]})", RuntimeWarning, stacklevel=2)


def suppress_autoload() -> None:
    """Load no pack automatically in this process (a process that builds a pack: what it packs
    must be what it compiled, not other packs' entries placed in its cache folder)."""
    global _AUTO
    if _AUTO is None:
        _AUTO = []


def loaded() -> list[PackReport]:
    """The reports of the packs autoload() loaded in this process (empty before it ran)."""
    return list(_AUTO or [])
