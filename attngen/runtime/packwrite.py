"""Writing compiled-kernel packs (the format: attngen.runtime.packs).

    with Capture() as cap:        # Triton's cache in a fresh temporary folder
        ...run the calls...       # every kernel they compile, and its launcher, lands there
    write_pack("model.pack", cap, rows=...)
    cap.close()

Only what is compiled inside the capture lands in its folder: a kernel this process compiled (or
loaded from a cache) before is held in Triton's in-memory cache and never reaches the folder, so a
pack is made in a fresh process (`attngen warmup ... --pack FILE` is one).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import sysconfig
import tempfile
import zipfile
from pathlib import Path

from attngen._version import __version__
from attngen.runtime import packs, tritonkey

ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # every member's timestamp: the same inputs give the same bytes
SCALARS = (bool, int, float, str, type(None))


class Capture:
    """Triton's file cache pointed at a fresh temporary folder (knobs.cache.dir, restored on exit)
    and, meanwhile, what attngen knows of each compiled kernel recorded by Triton's compilation
    listener: cache folder -> {function, module, uri, kernel_hash, constexprs}."""

    def __init__(self):
        self.kernels: dict[str, dict] = {}
        self._tmp = None
        self._scope = None
        self._previous = None
        self.cache_dir: Path | None = None

    def __enter__(self) -> "Capture":
        from triton import knobs

        packs.suppress_autoload()  # no other pack's entries into the folder this one is made from
        self._tmp = tempfile.TemporaryDirectory(prefix="attngen-pack-")
        self.cache_dir = Path(self._tmp.name)
        self._scope = knobs.cache.scope()
        self._scope.__enter__()
        knobs.cache.dir = str(self.cache_dir)
        self._previous = knobs.compilation.listener
        knobs.compilation.listener = self._listen
        return self

    def __exit__(self, *exc) -> None:
        from triton import knobs

        knobs.compilation.listener = self._previous
        self._scope.__exit__(*exc)

    def close(self) -> None:
        """Remove the temporary cache folder."""
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def _listen(self, *, src, metadata, metadata_group, times, cache_hit) -> None:
        if self._previous is not None:
            self._previous(src=src, metadata=metadata, metadata_group=metadata_group, times=times,
                           cache_hit=cache_hit)
        path = next((p for name, p in metadata_group.items() if name.endswith(".json")), None)
        if path is not None:
            self.kernels[Path(path).parent.name] = describe_source(src)


def _jsonable(value):
    return value if isinstance(value, SCALARS) else str(value)


def describe_source(src) -> dict:
    """A compiled kernel as attngen knows it: its function, and for a kernel of a generated module
    the module, its uri and its stamp's kernel hash, and the constexprs it was compiled with."""
    fn = getattr(src, "fn", None)
    out = {"function": getattr(src, "name", None)}
    module = sys.modules.get(getattr(fn, "module", None) or "")
    if module is not None and hasattr(module, "KERNEL_HASH"):
        out.update(module=module.__name__.rpartition(".")[2], uri=getattr(module, "URI", None),
                   kernel_hash=module.KERNEL_HASH)
    names = getattr(fn, "arg_names", None)
    if names:
        out["constexprs"] = {names[k[0]] + "".join(f"[{i}]" for i in k[1:]): _jsonable(v)
                             for k, v in sorted(getattr(src, "constants", {}).items())}
    return out


def _file(path: Path) -> tuple[dict, bytes]:
    data = path.read_bytes()
    return {"name": path.name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}, data


def collect(cache_dir: Path, kernels: dict | None = None) -> list[tuple[dict, dict[str, bytes]]]:
    """(entry, {file name: bytes}) of each complete entry of the Triton cache folder `cache_dir`,
    in folder order: kernels (cubin and metadata JSON; Triton's IR files stay out) and C modules
    (shared objects for this Python). `kernels`: Capture.kernels, to describe them."""
    kernels = kernels or {}
    key, settings = packs.triton_key_digest(), packs.compile_settings()
    import triton

    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    out = []
    for folder in sorted(Path(cache_dir).iterdir()):
        if not folder.is_dir() or not packs.ENTRY_DIR.fullmatch(folder.name):
            continue
        names = sorted(p.name for p in folder.iterdir() if p.is_file())
        groups = [n for n in names if n.startswith(packs.GROUP_PREFIX)]
        for group in groups:
            meta_name = group[len(packs.GROUP_PREFIX):]
            binary = folder / (meta_name[:-len(".json")] + ".cubin")
            if not binary.is_file() or not (folder / meta_name).is_file():
                continue  # not a CUDA kernel's entry, or not whole
            meta = json.loads((folder / meta_name).read_text())
            recs = [_file(binary), _file(folder / meta_name)]
            arch = meta["target"]["arch"]
            entry = {"kind": "kernel", "dir": folder.name, "name": meta["name"], "group": meta_name,
                     "files": [r for r, _ in recs], "triton_version": meta.get("triton_version"),
                     "triton_key": key, "target": meta["target"], "ptxas": packs.ptxas_version(arch),
                     "triton_settings": settings,
                     "options": {k: meta[k] for k in ("num_warps", "num_stages", "num_ctas", "maxnreg",
                                                      "launch_pdl") if k in meta},
                     "shared_bytes": meta.get("shared"), "kernel": kernels.get(folder.name)}
            out.append((entry, {r["name"]: d for r, d in recs}))
        if groups:
            continue
        for name in names:
            if name.endswith(suffix):
                rec, data = _file(folder / name)
                entry = {"kind": "c_module", "dir": folder.name, "name": name[:-len(suffix)], "files": [rec],
                         "triton_version": triton.__version__, "triton_key": key, "abi": packs.launcher_abi()}
                out.append((entry, {name: data}))
    return out


def _info(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=ZIP_TIME)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.create_system = 3  # unix, so that the mode below reads as a regular file's
    info.external_attr = (0o100644 << 16)
    return info


_THIS_PROCESS = object()


def write_pack(path, capture_or_entries, *, rows=(), built: dict | None = None, key_record=_THIS_PROCESS) -> dict:
    """Write a pack to `path` (atomically: a temporary file, then renamed) from a Capture (or from
    collect()'s list); `rows`: what the warmup ran (shape buckets, kernels, configs), `built`:
    where it was built (GPU name, ...), both kept in the manifest; `key_record`: the record of
    Triton's key the pack carries (default: this process's, runtime.tritonkey.record()). Returns
    summary(): entries, bytes per kind."""
    if isinstance(capture_or_entries, Capture):
        entries = collect(capture_or_entries.cache_dir, capture_or_entries.kernels)
    else:
        entries = list(capture_or_entries)
    manifest = {"format": packs.FORMAT, "version": packs.VERSION, "attngen": __version__,
                "built": built or {}, "warmup": list(rows), "entries": [e for e, _ in entries],
                "triton_key_record": tritonkey.record() if key_record is _THIS_PROCESS else key_record}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with zipfile.ZipFile(tmp, "w") as zf:
            zf.writestr(_info(packs.MANIFEST), json.dumps(manifest, indent=1, sort_keys=True) + "\n")
            for entry, blobs in entries:
                for rec in entry["files"]:
                    zf.writestr(_info(packs.member(entry["dir"], rec["name"])), blobs[rec["name"]])
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return summary(manifest, path.stat().st_size)


def summary(manifest: dict, pack_bytes: int | None = None) -> dict:
    """Entries and their bytes per kind (unpacked), and the pack file's size."""
    out = {"pack_bytes": pack_bytes}
    for kind in packs.KINDS:
        mine = [e for e in manifest["entries"] if e.get("kind") == kind]
        out[kind] = {"entries": len(mine), "bytes": sum(r["size"] for e in mine for r in e["files"])}
    return out
