"""Find and import the generated module for a KernelSpec.

Order: the built kernels (env.generated_dirs(): generated/, or for an installed package what
`attngen build` wrote into the user cache and then the wheel's kernels; through manifest.json, no
jinja2 needed), then the per-user cache, rendering the module there from the templates when it is
missing.
The first import also loads the compiled-kernel packs (attngen.runtime.packs.autoload).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import sys
import tempfile
import threading
from pathlib import Path
from types import ModuleType

from attngen import env
from attngen.runtime import packs, tritonkey
from attngen.spec import KernelSpec

_lock = threading.Lock()


@functools.lru_cache(maxsize=None)
def _manifest(gen_dir: str) -> dict:
    path = Path(gen_dir) / "manifest.json"
    if not path.exists():
        return {}
    return json.loads(path.read_text()).get("kernels", {})


def built_module_path(spec: KernelSpec) -> Path | None:
    for gen in env.generated_dirs():
        ent = _manifest(str(gen)).get(spec.uri)
        if ent is not None and (gen / ent["file"]).exists():
            return gen / ent["file"]
    return None


def cached_module_path(spec: KernelSpec) -> Path:
    """Render `spec` into the user cache (written only when the content changes)."""
    from attngen.codegen.naming import module_filename  # light
    from attngen.codegen.render import render  # imports jinja2: only on this path

    source = render(spec)
    cache = env.cache_dir() / "kernels"
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / module_filename(spec.uri, source)
    if not path.exists() or path.read_text() != source:
        fd, tmp = tempfile.mkstemp(dir=cache, prefix=".tmp-", suffix=".py")
        with os.fdopen(fd, "w") as fh:
            fh.write(source)
        os.replace(tmp, path)
    return path


def module_path(spec: KernelSpec) -> Path:
    return built_module_path(spec) or cached_module_path(spec)


@functools.lru_cache(maxsize=None)
def _import(path: str) -> ModuleType:
    tritonkey.install()  # Triton's cache key from the record of an earlier process (0.37 s on the H100)
    packs.autoload()  # compiled-kernel packs into Triton's cache, once, before any kernel can compile
    name = f"attngen_kernels.{Path(path).stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    return module


@functools.lru_cache(maxsize=None)
def load(spec: KernelSpec) -> ModuleType:
    """The generated module for `spec`, imported once per process."""
    with _lock:
        return _import(str(module_path(spec)))


def load_path(path: str | Path) -> ModuleType:
    with _lock:
        return _import(str(path))
