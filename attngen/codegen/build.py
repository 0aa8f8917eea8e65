"""`attngen build`: spec files -> generated/ (deterministic, stamped, written only when changed).

A build never destroys what it did not make. The output folder's manifest.json records, for every
kernel, the spec entries that asked for it ("sources", each naming its spec file by folder and file
name, see `attngen.spec.spec_label`). A build of some spec files (the *build set*):

* writes the kernels the build set asks for; where a kernel is also asked for by a spec file outside
  the build set (per the manifest), its header keeps listing that file's entry too;
* removes a kernel only when every spec file that asked for it is in the build set (a spec file
  counts as in it when it is one of the files built, or lives in a folder built, even if it was
  deleted from there since) and none asks for it now, or when it is an older build of a kernel
  written now (the file the manifest listed);
* keeps every other kernel, and its manifest entry, as it was. A kernel that a file of the build set
  no longer asks for, but another file still does, is re-rendered with the remaining sources.

`prune=True` makes the output folder exactly the build set's: every other `attn_*.py` goes.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from attngen import env
from attngen.codegen.naming import module_filename, sha256, source_label, source_stamp
from attngen.codegen.render import render
from attngen.spec import KernelSpec, load_specs, spec_label

MANIFEST = "manifest.json"
KERNEL_GLOB = "attn_*.py"


class BuildError(RuntimeError):
    """The output folder cannot be built into as asked (names the folder or file and why)."""


@dataclass
class BuildPlan:
    """Everything a build would write, computed in memory before anything touches the disk."""

    files: dict[str, str] = field(default_factory=dict)  # filename -> source
    specs: dict[str, KernelSpec] = field(default_factory=dict)  # filename -> spec
    sources: dict[str, list[str]] = field(default_factory=dict)  # uri -> [source_stamp, ...]
    labels: set[str] = field(default_factory=set)  # spec_label of every spec file built
    folders: set[str] = field(default_factory=set)  # names of the folders given as targets

    def owns(self, source: str) -> bool:
        """Whether a manifest source stamp names a spec file of this build: one of its files, or
        any file of a folder it builds (so a spec file deleted from the folder counts too)."""
        label = source_label(source)
        folder, _, _ = label.rpartition("/")
        return label in self.labels or (bool(folder) and folder in self.folders)

    def add(self, spec: KernelSpec, sources: list[str]) -> str:
        """Render `spec` stamped with `sources` (replacing an earlier file of its uri); returns the
        file name."""
        earlier = self.file_of(spec.uri)
        if earlier is not None:
            del self.files[earlier], self.specs[earlier]
        srcs = sorted(set(sources))
        text = render(spec, tuple(srcs))
        fname = module_filename(spec.uri, text)
        self.files[fname] = text
        self.specs[fname] = spec
        self.sources[spec.uri] = srcs
        return fname

    def file_of(self, uri: str) -> str | None:
        return next((f for f, s in self.specs.items() if s.uri == uri), None)

    def entries(self) -> dict[str, dict]:
        return {spec.uri: {"file": fname, "kernel_spec": spec.as_dict(), "sources": self.sources[spec.uri]}
                for fname, spec in self.specs.items()}


@dataclass
class BuildReport:
    written: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    why_removed: dict[str, str] = field(default_factory=dict)  # file -> reason
    kept: list[str] = field(default_factory=list)  # kernels of spec files outside the build set

    @property
    def stale(self) -> bool:
        return bool(self.written or self.removed)


def plan(targets: list[str | Path]) -> BuildPlan:
    """Validate every spec file first (one SpecError lists every problem), then render in memory."""
    loaded = load_specs(targets)  # raises before anything is rendered
    sources: dict[str, list[str]] = {}
    by_uri: dict[str, KernelSpec] = {}
    out = BuildPlan(folders={Path(os.path.abspath(t)).name for t in targets if Path(t).is_dir()})
    for spec_file in loaded:
        label = spec_label(spec_file.path)
        out.labels.add(label)
        digest = sha256(Path(spec_file.path).read_bytes())
        for entry in spec_file.entries:
            for ks in entry.kernel_specs():
                by_uri.setdefault(ks.uri, ks)
                sources.setdefault(ks.uri, []).append(source_stamp(label, entry.name, digest))
    for uri in sorted(by_uri):
        out.add(by_uri[uri], sources[uri])
    return out


def read_manifest(out_dir: Path) -> dict[str, dict]:
    """The kernels an earlier build recorded in `out_dir` (uri -> entry); {} when there is none."""
    path = out_dir / MANIFEST
    if not path.exists():
        return {}
    try:
        kernels = json.loads(path.read_text()).get("kernels", {})
        for uri, ent in kernels.items():
            if not (isinstance(ent, dict) and isinstance(ent.get("file"), str)
                    and isinstance(ent.get("sources", []), list)):
                raise ValueError(f"entry {uri!r} has no 'file' or a bad 'sources'")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise BuildError(f"{path}: not a manifest attngen can read ({type(exc).__name__}: {exc}); "
                         "it records which spec files made which kernels, so without it nothing "
                         "can be pruned safely: restore it, or rebuild with --prune") from None
    return kernels


def _spec_of(path: Path, uri: str, ent: dict) -> KernelSpec:
    try:
        return KernelSpec(**ent["kernel_spec"])
    except (KeyError, TypeError, ValueError) as exc:
        raise BuildError(f"{path}: kernel {uri!r}: bad 'kernel_spec' ({exc})") from None


def _merge(out_dir: Path, p: BuildPlan, old: dict[str, dict]) -> tuple[dict[str, dict], dict[str, str], list[str]]:
    """Fold the old manifest into the plan `p` (see the module docstring). Returns the manifest
    entries, the files to remove (-> why) and the files kept as they are."""
    remove: dict[str, str] = {}
    for uri, ent in old.items():  # kernels the build set asks for, also asked for from elsewhere
        others = [s for s in ent.get("sources", []) if not p.owns(s)]
        if uri in p.sources and others:
            p.add(p.specs[p.file_of(uri)], p.sources[uri] + others)
    entries = p.entries()
    kept: list[str] = []
    for uri, ent in sorted(old.items()):
        srcs = ent.get("sources", [])
        others = [s for s in srcs if not p.owns(s)]
        if uri in p.sources:
            if ent["file"] != p.file_of(uri):
                remove[ent["file"]] = f"older build of {uri}, replaced by {p.file_of(uri)}"
        elif srcs and not others:
            asked = ", ".join(sorted({source_label(s) for s in srcs}))
            remove[ent["file"]] = f"no longer asked for by {asked}"
        elif len(others) < len(srcs):
            # a spec file of this build no longer asks for it, another one still does
            fname = p.add(_spec_of(out_dir / MANIFEST, uri, ent), others)
            entries[uri] = p.entries()[uri]
            if ent["file"] != fname:
                remove[ent["file"]] = f"older build of {uri}, replaced by {fname}"
        elif (out_dir / ent["file"]).exists():  # not ours: left as it is
            entries[uri] = ent
            kept.append(ent["file"])
    return entries, remove, kept


def build(targets: list[str | Path], out_dir: Path | None = None, check: bool = False,
          prune: bool = False) -> BuildReport:
    """Build `targets` (spec files or folders) into `out_dir` (default: env.build_dir()).

    With check=True nothing is written: the report lists what a build would change. What is removed
    is described in the module docstring; prune=True removes every kernel file in `out_dir` that
    this build does not produce.
    """
    out_dir = Path(out_dir) if out_dir is not None else env.build_dir()
    if not check and _inside(out_dir, env.PACKAGE_DIR):
        raise BuildError(f"{out_dir}: inside the installed attngen package ({env.PACKAGE_DIR}), "
                         "which is read-only; build into another folder with --out (the default "
                         f"is {env.build_dir()})")
    p = plan(targets)
    existing = {f.name for f in out_dir.glob(KERNEL_GLOB)} if out_dir.exists() else set()
    report = BuildReport()
    if prune:
        entries = p.entries()
        remove = {f: "--prune: not made by this build" for f in existing}
    else:
        entries, remove, report.kept = _merge(out_dir, p, read_manifest(out_dir))
    wanted = {ent["file"]: p.files.get(ent["file"]) for ent in entries.values()}
    wanted = {f: text for f, text in wanted.items() if text is not None}  # kept files: not rewritten
    wanted[MANIFEST] = json.dumps({"kernels": entries}, indent=1, sort_keys=True) + "\n"
    for fname, text in wanted.items():
        path = out_dir / fname
        same = path.exists() and path.read_text() == text
        (report.unchanged if same else report.written).append(fname)
    keep = set(wanted) | set(report.kept)
    report.removed = sorted(f for f in remove if f in existing and f not in keep)
    report.why_removed = {f: remove[f] for f in report.removed}
    if check:
        return report
    out_dir.mkdir(parents=True, exist_ok=True)
    for fname in report.written:  # the manifest last: it only ever lists files that exist
        if fname != MANIFEST:
            _write_if_different(out_dir / fname, wanted[fname])
    if MANIFEST in report.written:
        _write_if_different(out_dir / MANIFEST, wanted[MANIFEST])
    for fname in report.removed:
        (out_dir / fname).unlink()
    return report


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
        return True
    except ValueError:
        return False


def _write_if_different(path: Path, text: str) -> bool:
    if path.exists() and path.read_text() == text:
        return False
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)
    return True
