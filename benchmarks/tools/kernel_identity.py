"""Check that the kernels of generated/ are those of a base commit, up to the module header and the ABI.

    python3 benchmarks/tools/kernel_identity.py [--base 103bbcd] [--dir generated]

For every kernel the base commit's generated/manifest.json lists, the file of that uri now (this
tree's manifest) and the base's file are compared as Python tokens after dropping:
  * comments (the stamp header is comments),
  * the module-level records of the kernel ABI and the stamp constants (`ABI = ...`,
    `ABI["..."] = ...`, `VARIANTS = ...`, `TEMPLATE_HASH = ...`, `KERNEL_HASH = ...`),
  * line breaks inside brackets (NL tokens: a signature may wrap differently),
and with each decorator's do_not_specialize list compared as the set of the kernel's parameters it
names (what Triton applies: it tests each parameter for membership and ignores other names).
Everything else -- every statement of every kernel, the decorators' kind, the signatures' names,
order and annotations -- must be token-identical, with one allowance: the GQA ratio, a literal in
the base's kernels, is now the constexpr parameter GQA (Triton specializes a constexpr, so the
compiled kernel is the same). In the modules (this tree's, and a base's that has GQA_RATIO) the tokens `GQA: tl.constexpr,` (or gl.) and
`GQA,` as an argument are dropped and every other `GQA` reads as the module's GQA_RATIO. Exit
status 1 on a difference (printed with the first differing tokens), on a kernel missing on either
side, or on an extra one.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import subprocess
import sys
import tokenize
from pathlib import Path

DROPPED = {"ABI", "VARIANTS", "TEMPLATE_HASH", "KERNEL_HASH"}


def _dropped_lines(tree: ast.Module) -> set[int]:
    lines = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            t = node.targets[0]
            name = t.id if isinstance(t, ast.Name) else (
                t.value.id if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) else None)
            if name in DROPPED:
                lines.update(range(node.lineno, node.end_lineno + 1))
    return lines


def _dns(tree: ast.Module) -> dict[str, tuple[set, set[int]]]:
    """Function -> (its do_not_specialize names as a set, the lines of that keyword's value)."""
    out = {}
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for dec in node.decorator_list:
            if isinstance(dec, ast.Call):
                for kw in dec.keywords:
                    if kw.arg == "do_not_specialize":
                        # Triton ignores a name that is no parameter: compare what it applies
                        params = {a.arg for a in node.args.args}
                        names = {e.value for e in kw.value.elts} & params
                        out[node.name] = (names, (kw.value.lineno, kw.value.col_offset,
                                                  kw.value.end_lineno, kw.value.end_col_offset))
    return out


def _inline_constexpr(toks: list[tuple[int, str]], name: str, value: str) -> list[tuple[int, str]]:
    """`name: tl.constexpr,` / `name: gl.constexpr,` and `name,` as an argument dropped, other
    `name` -> value."""
    out, i = [], 0
    while i < len(toks):
        words = [t[1] for t in toks[i:i + 6]]
        if words[:1] == [name]:
            if words[1:5] in ([":", "tl", ".", "constexpr"], [":", "gl", ".", "constexpr"]) and words[5:6] == [","]:
                i += 6
                continue
            if words[1:2] == [","] and out and out[-1][1] in ("(", ","):  # a bare argument
                i += 2
                continue
            out.append((toks[i][0], value))
        else:
            out.append(toks[i])
        i += 1
    return out


def normalized(source: str, inline: dict[str, str] | None = None) -> tuple[list[tuple[int, str]], dict[str, set]]:
    tree = ast.parse(source)
    drop = _dropped_lines(tree)
    dns = _dns(tree)
    spans = [span for _, span in dns.values()]
    toks = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER):
            continue
        if tok.start[0] in drop:
            continue
        if any((l0, c0) <= tok.start and tok.end <= (l1, c1) for l0, c0, l1, c1 in spans):
            if tok.string == "[":
                toks.append((tok.start[0], "[<do_not_specialize>"))
            continue
        toks.append((tok.start[0], tok.string))
    for name, value in (inline or {}).items():
        toks = _inline_constexpr(toks, name, value)
    # consecutive NEWLINE tokens left where dropped statements were: one is enough
    out = []
    for t in toks:
        if t[1] in ("\n", "") and out and out[-1][1] in ("\n", ""):
            continue
        out.append(t)
    return out, {name: names for name, (names, _) in dns.items()}


def _gqa_inline(source: str) -> dict[str, str] | None:
    ratio = next((ln.split(" = ", 1)[1] for ln in source.splitlines() if ln.startswith("GQA_RATIO = ")), None)
    return {"GQA": ratio} if ratio else None


def compare(old: str, new: str) -> str | None:
    # both sides: a base made after GQA became a constexpr carries it too
    (ot, od), (nt, nd) = normalized(old, _gqa_inline(old)), normalized(new, _gqa_inline(new))
    # a constexpr is never in do_not_specialize, so the sets compare as they are
    if od != nd:
        diff = {f: (od.get(f), nd.get(f)) for f in set(od) | set(nd) if od.get(f) != nd.get(f)}
        return f"do_not_specialize differs: {diff}"
    for i, (a, b) in enumerate(zip(ot, nt)):
        if a[1] != b[1]:
            return f"token {i}: base line {a[0]} {a[1]!r} vs now line {b[0]} {b[1]!r}"
    if len(ot) != len(nt):
        return f"{len(ot)} tokens in the base, {len(nt)} now"
    return None


def _git_show(base: str, path: str) -> str:
    return subprocess.run(["git", "show", f"{base}:{path}"], check=True, capture_output=True, text=True).stdout


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="103bbcd")
    ap.add_argument("--dir", default="generated")
    args = ap.parse_args(argv)
    old_kernels = json.loads(_git_show(args.base, f"{args.dir}/manifest.json"))["kernels"]
    new_kernels = json.loads(Path(args.dir, "manifest.json").read_text())["kernels"]
    bad = 0
    for uri in sorted(set(old_kernels) | set(new_kernels)):
        if uri not in new_kernels or uri not in old_kernels:
            print(f"{uri}: only in {'the base' if uri in old_kernels else 'this tree'}")
            bad += 1
            continue
        old = _git_show(args.base, f"{args.dir}/{old_kernels[uri]['file']}")
        new = Path(args.dir, new_kernels[uri]["file"]).read_text()
        why = compare(old, new)
        if why:
            print(f"{uri}: {why}")
            bad += 1
    n = len(set(old_kernels) | set(new_kernels))
    print(f"{n - bad} of {n} kernels identical to {args.base} up to header and ABI")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
