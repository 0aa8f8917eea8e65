"""`attngen build`: spec files -> generated/ (deterministic, stamped, written only when changed)."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from attngen import env
from attngen.codegen.naming import module_filename, sha256
from attngen.codegen.render import render
from attngen.spec import KernelSpec, load_spec, spec_files

MANIFEST = "manifest.json"


@dataclass
class BuildPlan:
    """Everything a build would write, computed in memory before anything touches the disk."""

    files: dict[str, str] = field(default_factory=dict)  # filename -> source
    specs: dict[str, KernelSpec] = field(default_factory=dict)  # filename -> spec
    sources: dict[str, list[str]] = field(default_factory=dict)  # uri -> ["file#entry", ...]

    def manifest(self) -> str:
        entries = {}
        for fname, spec in sorted(self.specs.items(), key=lambda kv: kv[1].uri):
            entries[spec.uri] = {"file": fname, "kernel_spec": spec.as_dict(),
                                 "sources": self.sources[spec.uri]}
        return json.dumps({"kernels": entries}, indent=1, sort_keys=True) + "\n"


@dataclass
class BuildReport:
    written: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    @property
    def stale(self) -> bool:
        return bool(self.written or self.removed)


def _display_path(p: Path) -> str:
    try:
        return p.resolve().relative_to(env.REPO_ROOT).as_posix()
    except ValueError:
        return p.as_posix()


def plan(targets: list[str | Path]) -> BuildPlan:
    """Validate every spec file first (SpecError lists all problems), then render in memory."""
    files = [f for t in targets for f in spec_files(t)]
    loaded = [(f, load_spec(f)) for f in files]  # raises before anything is rendered
    by_uri: dict[str, KernelSpec] = {}
    sources: dict[str, list[str]] = {}
    for f, spec_file in loaded:
        digest = sha256(f.read_bytes())[:16]
        for entry in spec_file.entries:
            for ks in entry.kernel_specs():
                by_uri.setdefault(ks.uri, ks)
                src = f"{_display_path(f)}#{entry.name} (sha256 {digest})"
                if src not in sources.setdefault(ks.uri, []):
                    sources[ks.uri].append(src)
    out = BuildPlan()
    for uri in sorted(by_uri):
        srcs = sorted(sources[uri])
        out.sources[uri] = srcs
        text = render(by_uri[uri], tuple(srcs))
        fname = module_filename(uri, text)
        out.files[fname] = text
        out.specs[fname] = by_uri[uri]
    return out


def _write_if_different(path: Path, text: str) -> bool:
    if path.exists() and path.read_text() == text:
        return False
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)
    return True


def build(targets: list[str | Path], out_dir: Path | None = None, check: bool = False,
          prune: bool | None = None) -> BuildReport:
    """Build `targets` (spec files or folders) into `out_dir`.

    With check=True nothing is written: the report lists what a build would change. Stale kernel
    files (in out_dir but not produced) are removed when `prune` (default: building the whole
    specs folder, i.e. the target set is a folder) -- a single-file build only adds.
    """
    out_dir = Path(out_dir) if out_dir is not None else env.generated_dir()
    p = plan(targets)
    if prune is None:
        prune = any(Path(t).is_dir() for t in targets)
    report = BuildReport()
    existing = {f.name for f in out_dir.glob("attn_*.py")} if out_dir.exists() else set()
    manifest_text = p.manifest()
    if not prune:
        # keep what is already there: merge the old manifest's entries not rebuilt now
        manifest_text = _merged_manifest(out_dir, p)
    wanted = dict(p.files)
    wanted[MANIFEST] = manifest_text
    for fname, text in wanted.items():
        path = out_dir / fname
        same = path.exists() and path.read_text() == text
        (report.unchanged if same else report.written).append(fname)
    if prune:
        report.removed = sorted(existing - set(p.files))
    else:  # an older build of a uri rebuilt now
        rebuilt = {spec.uri for spec in p.specs.values()}
        report.removed = sorted(f for f in existing - set(p.files) if f[:-3].rsplit("_", 1)[0] in rebuilt)
    if check:
        return report
    out_dir.mkdir(parents=True, exist_ok=True)
    for fname in report.written:
        _write_if_different(out_dir / fname, wanted[fname])
    for fname in report.removed:
        (out_dir / fname).unlink()
    return report


def _merged_manifest(out_dir: Path, p: BuildPlan) -> str:
    new = json.loads(p.manifest())["kernels"]
    path = out_dir / MANIFEST
    if path.exists():
        old = json.loads(path.read_text()).get("kernels", {})
        for uri, ent in old.items():
            if uri not in new and (out_dir / ent["file"]).exists():
                new[uri] = ent
    return json.dumps({"kernels": new}, indent=1, sort_keys=True) + "\n"
