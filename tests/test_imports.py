"""The import graph runs one way: no cycle between attngen's modules, nor between its packages
(attngen/<package>/, each top-level module its own node), counting imports inside functions too
(walked with ast, nothing imported). And planning an sm90 call -- what attention() does on a
Hopper GPU -- imports neither jinja2 nor optuna nor SQLAlchemy."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path

import attngen

PKG = Path(attngen.__file__).resolve().parent


def modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = p.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the attngen modules it imports (anywhere in its body)."""
    mods = modules()
    graph = defaultdict(set)
    for name, path in mods.items():
        pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[:len(pkg.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for t in targets:
                while t and t not in mods:  # attngen.x.y.attr -> attngen.x.y
                    t = t.rpartition(".")[0]
                if t.startswith("attngen") and t != name and t != "attngen":
                    graph[name].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    nodes = set(graph) | {w for vs in graph.values() for w in vs}

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def package_of(module: str) -> str:
    """attngen.<package> for a module inside a subpackage, the module itself at top level."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and (PKG / parts[1]).is_dir() else module


def test_the_graph_sees_imports_inside_functions():
    graph = import_graph()
    assert "attngen.runtime.ops" in graph["attngen.runtime.public"]
    assert "attngen.db.store" in graph["attngen.tuning.commands"]  # imported inside a function


def test_no_import_cycle_between_modules():
    assert cycles(import_graph()) == []


def test_no_import_cycle_between_packages():
    pkg_graph = defaultdict(set)
    for src, dests in import_graph().items():
        for d in dests:
            if package_of(src) != package_of(d):
                pkg_graph[package_of(src)].add(package_of(d))
    found = cycles(pkg_graph)
    detail = {c[0]: sorted(f"{s} -> {d}" for s, ds in import_graph().items() for d in ds
                            if package_of(s) in c and package_of(d) in c and package_of(s) != package_of(d))
              for c in found}
    assert found == [], detail


def test_planning_an_sm90_call_imports_no_jinja2_optuna_or_sqlalchemy():
    """Plans of a shipped sm90 kernel (bf16 hd128 GQA 4 causal, in generated/) on meta tensors
    with an H200 stand-in, forward and backward, default and tuned configs: none of the three
    modules is imported."""
    code = textwrap.dedent("""
        import sys
        import torch
        import attngen
        from attngen.runtime import api, dispatch, plan
        from attngen.runtime import validate
        plan.check_device = lambda device, interpret: None
        dispatch.device_target = lambda device: "sm90"
        dispatch.device_class = lambda device, interpret: "h100"
        for s in (1024, 4096, 128):
            q = torch.empty(2, 32, s, 128, dtype=torch.bfloat16, device="meta")
            k = torch.empty(2, 8, s, 128, dtype=torch.bfloat16, device="meta")
            opts = validate.make_options(128, True, (-1, -1), 0.0, None, "bottom_right", "bhsd")
            fwd = api.ForwardPlan(q, k, k, opts)
            out, lse = fwd.empty()
            api.BackwardPlan(torch.empty_like(out), q, k, k, out, lse, opts, False)
            assert fwd.spec.target == "sm90", fwd.spec
        print(sorted(m for m in ("jinja2", "optuna", "sqlalchemy") if m in sys.modules))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


# The layers, bottom first: a package or top-level module imports only from layers below its own
# (problem -> spec -> codegen -> kernels -> runtime, tuning and bench above them). A new package or module
# must be placed here.
LAYERS = [
    {"attngen.env", "attngen._version", "attngen.buckets", "attngen.devices", "attngen.interp"},
    {"attngen.problem"},
    {"attngen.spec", "attngen.testing"},
    {"attngen.kernels"},
    {"attngen.families"},
    {"attngen.configs"},
    {"attngen.codegen"},
    {"attngen.db"},
    {"attngen.runtime"},
    {"attngen.integrations", "attngen.flash_attn_interface", "attngen.distributed"},
    {"attngen.tuning", "attngen.bench"},
    {"attngen.cli"},
]


def test_imports_go_down_the_layers():
    rank = {p: i for i, layer in enumerate(LAYERS) for p in layer}
    graph = import_graph()
    unplaced = sorted({package_of(m) for m in graph} - set(rank) - {"attngen"})
    assert not unplaced, f"place these in LAYERS: {unplaced}"
    upward = sorted(f"{s} -> {d}" for s, ds in graph.items() for d in ds
                    if package_of(s) != "attngen" and package_of(s) != package_of(d)
                    and rank[package_of(s)] <= rank[package_of(d)])
    assert upward == [], upward
