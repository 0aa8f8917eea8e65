"""Structural checks of every generated module: each function that reads the GQA constexpr takes it
as a parameter, and every call of a module function -- direct, or as a warp-specialized partition
`(fn, (args...))` -- passes one argument per parameter (Gluon partitions only fail on a GPU)."""

from __future__ import annotations

import ast
import json

from attngen.env import REPO_ROOT

GENERATED = REPO_ROOT / "generated"


def _modules():
    manifest = json.loads((GENERATED / "manifest.json").read_text())["kernels"]
    for ent in manifest.values():
        yield ent["file"], ast.parse((GENERATED / ent["file"]).read_text())


def test_gqa_is_a_parameter_where_it_is_read():
    for fname, tree in _modules():
        for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
            reads = any(isinstance(n, ast.Name) and n.id == "GQA" for n in ast.walk(fn))
            if reads:
                assert "GQA" in {a.arg for a in fn.args.args}, (fname, fn.name)


def test_calls_pass_every_parameter():
    checked = 0
    for fname, tree in _modules():
        arity = {n.name: len(n.args.args) for n in tree.body if isinstance(n, ast.FunctionDef)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in arity:
                assert len(node.args) + len(node.keywords) == arity[node.func.id], (fname, node.func.id, node.lineno)
                checked += 1
            if (isinstance(node, ast.Tuple) and len(node.elts) == 2 and isinstance(node.elts[0], ast.Name)
                    and node.elts[0].id in arity and isinstance(node.elts[1], ast.Tuple)):
                assert len(node.elts[1].elts) == arity[node.elts[0].id], (fname, node.elts[0].id, node.lineno)
                checked += 1
    assert checked > 100
