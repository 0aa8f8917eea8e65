"""The family table (attngen.families) is the one place a kernel family is registered: its entry
points, its launcher, its config class. These tests keep the table and the code it names in step."""

from __future__ import annotations

import ast
import inspect
import json

import pytest

from attngen import env
from attngen.families import FAMILIES, family


def _launched_entry_points(launcher) -> set[str]:
    """Names of the generated module's functions a launcher launches (`mod._attn_...`)."""
    tree = ast.parse(inspect.getsource(inspect.getmodule(launcher)))
    return {n.attr for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "mod"
            and n.attr.startswith("_attn_")}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_table_lists_every_entry_point_its_launcher_launches(name):
    fam = family(name)
    launcher = fam.launches()
    assert callable(launcher) and launcher.__name__ == fam.launcher.rpartition(":")[2]
    assert _launched_entry_points(launcher) == set(fam.kernels)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_generated_module_defines_its_familys_portable_entry_point(name):
    fam = family(name)
    manifest = json.loads((env.generated_dir() / "manifest.json").read_text())["kernels"]
    modules = [m for m in manifest.values() if m["kernel_spec"]["family"] == name]
    assert modules, f"no generated {name} kernels"
    for m in modules:
        tree = ast.parse((env.generated_dir() / m["file"]).read_text())
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert fam.kernels[0] in defined, m["file"]


def test_unknown_family_is_a_clear_error():
    with pytest.raises(ValueError, match=r"unknown kernel family 'decode' \(known: fwd, bwd\)"):
        family("decode")


def test_tune_offers_the_registered_families():
    from attngen.cli import make_parser
    from attngen.tuning.targets import TuneOptions

    assert TuneOptions(device="h100").families == tuple(FAMILIES)
    assert make_parser().parse_args(["tune", "--device", "h100", "--family", "bwd"]).families == ["bwd"]
    with pytest.raises(SystemExit):
        make_parser().parse_args(["tune", "--device", "h100", "--family", "decode"])
