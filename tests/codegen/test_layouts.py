"""The layout axis of the templates: the Gluon forward's one main loop takes what a layout decides
from a layout partial (dense or packed documents) with one interface, and the addressing partial
writes each tensor's first row per layout."""

from __future__ import annotations

import ast
import re

import pytest

from attngen.codegen.render import render
from attngen.env import REPO_ROOT
from attngen.spec import KernelSpec

TEMPLATES = REPO_ROOT / "templates"
LAYOUTS = ("_ws_fwd_dense.py.jinja", "_ws_fwd_docs.py.jinja")


def _interface(name: str) -> set[str]:
    """The macros and top-level names a layout partial gives its users (leading "_" = private)."""
    text = (TEMPLATES / name).read_text()
    names = set(re.findall(r"\{%-? macro (\w+)\(", text)) | set(re.findall(r"^\{%-? set (\w+) =", text, re.M))
    return {n for n in names if not n.startswith("_")}


def _used_by_main_loop() -> set[str]:
    return set(re.findall(r"\bL\.(\w+)", (TEMPLATES / "_mainloop_ws.py.jinja").read_text()))


def test_layout_partials_give_what_the_main_loop_uses():
    used = _used_by_main_loop()
    assert used, "the main loop reads no layout partial"
    for name in LAYOUTS:
        missing = used - _interface(name)
        assert not missing, f"{name} lacks {sorted(missing)}, which _mainloop_ws.py.jinja uses"


def _ws_source(varlen: bool) -> str:
    spec = KernelSpec(family="fwd", dtype="bf16", target="sm90", head_dim_qk=128, head_dim_v=128,
                      gqa_ratio=4, mask="causal", varlen=varlen)
    return render(spec)


def _functions(source: str) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}


@pytest.mark.parametrize("varlen", [False, True])
def test_one_main_loop_both_layouts(varlen):
    """Both layouts get the same consumer tile and partitions; only the packed one walks work items
    and fixes the key block past a document's end."""
    fns = _functions(_ws_source(varlen))
    shared = {"_attn_fwd_ws", "_attn_fwd_ws_tile", "_attn_fwd_ws_consume", "_attn_fwd_ws_load",
              "_attn_fwd_ws_consumer0", "_attn_fwd_ws_consumer1", "_attn_fwd_ws_blocks", "_attn_fwd_ws_release"}
    assert shared <= set(fns), sorted(shared - set(fns))
    packed_only = {"_attn_fwd_ws_item", "_attn_fwd_ws_fix_v"}
    assert (packed_only <= set(fns)) if varlen else not (packed_only & set(fns))
    tile = ast.unparse(fns["_attn_fwd_ws_tile"])
    assert ("_attn_fwd_ws_fix_v" in tile) == varlen
    assert ("async_copy_shared_to_global" in tile) != varlen  # dense: O through TMA stores


@pytest.mark.parametrize("varlen", [False, True])
def test_addressing_per_layout(varlen):
    """Dense calls start a batch's rows at off_z * stride_<t>z, packed documents at the document's
    first row times the row stride; no kernel of the other layout's form."""
    spec = KernelSpec(family="bwd", dtype="fp16", target="sm80", head_dim_qk=64, head_dim_v=64,
                      gqa_ratio=2, mask="causal", varlen=varlen)
    for src in (render(spec), render(spec.replace(family="fwd"))):
        dense = re.findall(r"off_z\.to\(tl\.int64\) \* stride_\w+z", src)
        packed = re.findall(r"[qk]_start\.to\(tl\.int64\) \* stride_\w+[mn]", src)
        assert (bool(packed), bool(dense)) == (varlen, not varlen), (len(dense), len(packed))
