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
import re
import sys
import tempfile
import threading
import warnings
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
    """The built module of `spec` in the generated folders (env.generated_dirs()), None when none
    is there or the one there was built from other templates than the current ones (then the
    runtime renders the current templates; a warning says to rebuild)."""
    for gen in env.generated_dirs():
        ent = _manifest(str(gen)).get(spec.uri)
        if ent is not None and (gen / ent["file"]).exists():
            path = gen / ent["file"]
            if built_from_current_templates(path):
                return path
    return None


# a module's stamp line naming its family template and the hash of it with its partials
_TEMPLATE_STAMP = re.compile(r"^# template: +templates/(\S+) \(sha256 ([0-9a-f]+)\)$", re.M)
# what a template imports or includes (the names Jinja's parser finds: codegen/render.py's
# _imported, which tests/runtime/test_stale_build.py holds this to)
_TEMPLATE_REF = re.compile(r"""\{%-?\s*(?:import|from|include|extends)\s+["']([^"']+)["']""")
_warned: set[str] = set()


def template_closure(root: str, name: str) -> tuple[str, ...]:
    """`name` and the templates it imports, transitively: the names render.family_template_hash
    hashes, found without Jinja (the runtime does not import it)."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(_TEMPLATE_REF.findall((Path(root) / n).read_text()))
    return (name, *sorted(seen - {name}))


@functools.lru_cache(maxsize=None)
def current_template_hash(root: str, name: str) -> str:
    """render.family_template_hash of the family whose template is `name`, from the files now in
    `root` (each family's once per process)."""
    from attngen.codegen.hashing import templates_hash

    return templates_hash(root, template_closure(root, name))


def built_from_current_templates(path: Path) -> bool:
    """Whether the module at `path` was built from the templates now in env.templates_dir() (its
    stamp's template hash is theirs). A module without a template stamp, or templates that cannot
    be read, count as current: the build is all there is."""
    with open(path) as fh:
        head = fh.read(4096)
    m = _TEMPLATE_STAMP.search(head)
    if m is None:
        return True
    try:
        current = current_template_hash(str(env.templates_dir()), m[1])
    except OSError:
        return True
    if current == m[2]:
        return True
    if str(path) not in _warned:
        _warned.add(str(path))
        warnings.warn(f"attngen: {path} was built from other templates (template hash {m[2]}, now {current}); "
                      "rendering the current ones instead: run `attngen build`", RuntimeWarning, stacklevel=3)
    return False


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
