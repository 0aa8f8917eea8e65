"""A built module is used only while it was built from the current templates
(attngen/runtime/loader.py: built_from_current_templates): one whose stamp carries another template
hash is passed over, with a warning, and the current templates are rendered instead."""

from __future__ import annotations

import json
import shutil

import pytest

from attngen import env
from attngen.codegen import render
from attngen.codegen.naming import FAMILY_TEMPLATES
from attngen.runtime import loader
from attngen.spec import KernelSpec


@pytest.mark.parametrize("family", sorted(FAMILY_TEMPLATES))
def test_the_runtime_hashes_templates_as_the_build_does(family):
    """Without Jinja, the same closure of partials and the same hash as codegen/render.py."""
    root = env.templates_dir()
    name = FAMILY_TEMPLATES[family]
    assert set(loader.template_closure(str(root), name)) == render._imported(name, root)
    assert loader.current_template_hash(str(root), name) == render.family_template_hash(family)


def _built(tmp_path, monkeypatch, edit=None):
    spec = KernelSpec("fwd", "bf16", "sm80", 64, 64, 1, "causal")
    src = loader.cached_module_path(spec)  # the current templates' module
    gen = tmp_path / "gen"
    gen.mkdir()
    text = src.read_text()
    (gen / src.name).write_text(edit(text) if edit else text)
    (gen / "manifest.json").write_text(json.dumps({"kernels": {spec.uri: {"file": src.name, "sources": []}}}))
    monkeypatch.setenv("ATTNGEN_GENERATED_DIR", str(gen))
    return spec, gen / src.name


def test_a_current_build_is_used(tmp_path, monkeypatch):
    spec, path = _built(tmp_path, monkeypatch)
    assert loader.built_module_path(spec) == path


def test_a_build_from_other_templates_is_passed_over(tmp_path, monkeypatch):
    def other(text):
        line = next(ln for ln in text.splitlines() if ln.startswith("# template:"))
        return text.replace(line, line[:line.index("(sha256 ")] + "(sha256 0000000000000000)")

    spec, path = _built(tmp_path, monkeypatch, other)
    with pytest.warns(RuntimeWarning, match="built from other templates"):
        assert loader.built_module_path(spec) is None
    assert loader.module_path(spec).parent == env.cache_dir() / "kernels"  # rendered instead


def test_templates_that_cannot_be_read_trust_the_build(tmp_path, monkeypatch):
    spec, path = _built(tmp_path, monkeypatch)
    monkeypatch.setenv("ATTNGEN_TEMPLATES_DIR", str(tmp_path / "nowhere"))
    assert loader.built_module_path(spec) == path
    shutil.rmtree(tmp_path / "gen")
    assert loader.built_module_path(spec) is None  # nothing built there at all
