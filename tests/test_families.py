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
    """Names of the generated module's entry points a launcher launches (`Launch.of(mod, "_attn_...")`
    in the launcher function's own source)."""
    tree = ast.parse(inspect.getsource(launcher).lstrip())
    return {n.args[1].value for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "of"
            and isinstance(n.func.value, ast.Name) and n.func.value.id == "Launch" and len(n.args) > 1
            and isinstance(n.args[1], ast.Constant)}


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
    with pytest.raises(ValueError, match=r"unknown kernel family 'prefill' \(known: fwd, bwd, decode, fwd_fp8, prefill_paged\)"):
        family("prefill")


def test_tune_offers_the_registered_families():
    from attngen.cli import make_parser
    from attngen.tuning.targets import TuneOptions

    assert TuneOptions(device="h100").families == tuple(FAMILIES)
    assert make_parser().parse_args(["tune", "--device", "h100", "--family", "bwd"]).families == ["bwd"]
    with pytest.raises(SystemExit):
        make_parser().parse_args(["tune", "--device", "h100", "--family", "prefill"])
