"""Spec files: YAML text -> validated SpecFile objects, every problem reported with its file, entry
and field (SpecError). Which files a build reads (spec_files, load_specs) and how a file is named
in generated headers (spec_label)."""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any, Sequence

import yaml

from attngen.spec import named as N
from attngen.spec.loading_expr import entry_expressions, expr_mapping
from attngen.spec.model import (ALIGNMENTS, DTYPES, ENTRY_FAMILIES, FP8_FAMILIES, IMPLEMENTED_DTYPES, INNER_MASKS, MASKS,
                                MAX_HEAD_DIM, MIN_HEAD_DIM, TARGETS, SpecEntry, SpecError, SpecFile,
                                _NAME_RE, _is_int, _is_num)

_ENTRY_FIELDS = {
    "name": "kernel name (identifier)",
    "description": "free text",
    "head_dim": "head dim of Q, K and V",
    "head_dim_qk": "head dim of Q and K (with head_dim_v, instead of head_dim)",
    "head_dim_v": "head dim of V and the output",
    "num_q_heads": "query heads",
    "num_kv_heads": "key/value heads",
    "gqa_ratio": "query heads per KV head (instead of num_q_heads/num_kv_heads)",
    "mask": "none | causal | sliding_window | document | a named mask (chunked, prefix_lm, sink_window, "
            "gpt_oss_swa) | {expr: \"...\"}",
    "document_mask": "mask inside each document: none | causal | sliding_window",
    "window": "sliding window width in keys, the query itself included (sliding_window, sink_window)",
    "chunk": "chunk length in positions (mask: chunked)",
    "sink_tokens": "attention-sink keys at the start (mask: sink_window)",
    "num_buckets": "relative position buckets, both directions (score_mod: t5_bias; default 32)",
    "max_distance": "distance of the last bucket (score_mod: t5_bias; default 128)",
    "score_mod": "a named score modification (alibi, t5_bias) | {expr: \"...\"}",
    "let": "named sub-expressions for mask / score_mod expressions, in order: {name: \"expr\"}",
    "params": "parameters of the expressions: {name: {shape: [h, 32], dtype: fp32, learnable: false}}",
    "sinks": "learned | none: a learned logit per query head joins every row's softmax denominator",
    "causal_alignment": "bottom_right | top_left",
    "softcap": "tanh softcap value, 0 = off",
    "softmax_scale": "softmax scale, null = 1/sqrt(head_dim_qk)",
    "dtypes": "fp16 | bf16 | fp8_e4m3, or a list (fp8_e4m3: sm90 only, forward only: inference kernels with fp8 operands)",
    "targets": "sm80 | sm90, or a list",
    "families": "fwd | bwd | decode | prefill_paged, or a list (decode: split-KV kernels for short queries on a KV "
                "cache; prefill_paged: chunked prefill on a paged KV cache, for entries without expressions or sinks; "
                "document entries get neither)",
}
_TOP_FIELDS = ("model", "description", "kernels")
DEFAULT_FAMILIES = ("fwd", "bwd", "decode", "prefill_paged")


class _Entry:
    """Collects problems for one entry, each prefixed with file / entry / field."""

    def __init__(self, path: str, index: int, raw: dict, problems: list[str]):
        self.path, self.raw, self.problems = path, raw, problems
        name = raw.get("name")
        self.label = f"kernel {name!r} (entry {index})" if isinstance(name, str) else f"entry {index}"

    def bad(self, field: str, msg: str) -> None:
        self.problems.append(f"{self.path}: {self.label}: field '{field}': {msg}")

    def int_field(self, field: str, lo: int, hi: int | None = None, required: bool = False):
        if field not in self.raw or self.raw[field] is None:
            if required:
                self.bad(field, "is required")
            return None
        v = self.raw[field]
        if not _is_int(v):
            self.bad(field, f"must be an integer, got {type(v).__name__} {v!r}")
            return None
        if v < lo or (hi is not None and v > hi):
            rng = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
            self.bad(field, f"must be {rng}, got {v}")
            return None
        return v

    def choice(self, field: str, choices: tuple[str, ...], default: str | None, required=False):
        if field not in self.raw or self.raw[field] is None:
            if required:
                self.bad(field, f"is required (one of {', '.join(choices)})")
            return default
        v = self.raw[field]
        if not isinstance(v, str) or v not in choices:
            self.bad(field, f"must be one of {', '.join(choices)}, got {v!r}")
            return None
        return v

    def choices(self, field: str, choices: tuple[str, ...], default: tuple[str, ...] | None,
                offered: tuple[str, ...] | None = None):
        """`offered`: the values a hint suggests, when not all of `choices` can be built yet."""
        hint = ", ".join(offered or choices)
        if field not in self.raw or self.raw[field] is None:
            if default is None:
                self.bad(field, f"is required (one or a list of {hint})")
            return default
        v = self.raw[field]
        items = [v] if isinstance(v, str) else v
        if not isinstance(items, list) or not items:
            self.bad(field, f"must be one of {hint} or a non-empty list of them, got {v!r}")
            return None
        out = []
        for it in items:
            if not isinstance(it, str) or it not in choices:
                self.bad(field, f"unknown value {it!r} (expected {hint})")
                return None
            if it in out:
                self.bad(field, f"{it!r} is listed twice")
                return None
            out.append(it)
        return tuple(out)


def _head_dim(e: _Entry, field: str) -> int | None:
    return e.int_field(field, MIN_HEAD_DIM, MAX_HEAD_DIM)


def _parse_entry(path: str, index: int, raw: Any, problems: list[str]) -> SpecEntry | None:
    if not isinstance(raw, dict):
        problems.append(f"{path}: entry {index}: must be a mapping of fields, got {type(raw).__name__}")
        return None
    e = _Entry(path, index, raw, problems)
    start = len(problems)
    for key in raw:
        if key not in _ENTRY_FIELDS:
            e.bad(str(key), _unknown_field(key, _ENTRY_FIELDS))
    # a field set to null is a field left out (its default, or "is required")
    raw = e.raw = {k: v for k, v in raw.items() if v is not None}
    name = raw.get("name")
    if name is None:
        e.bad("name", "is required")
    elif not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        e.bad("name", f"must be an identifier (letters, digits, '_', '-'), got {name!r}")
    if "description" in raw and not isinstance(raw["description"], str):
        e.bad("description", "must be a string")

    # head dims
    hd_qk = hd_v = None
    if "head_dim" in raw:
        for f in ("head_dim_qk", "head_dim_v"):
            if f in raw:
                e.bad(f, "give either head_dim or head_dim_qk/head_dim_v, not both")
        hd_qk = hd_v = _head_dim(e, "head_dim")
    elif "head_dim_qk" in raw:
        hd_qk = _head_dim(e, "head_dim_qk")
        hd_v = _head_dim(e, "head_dim_v") if "head_dim_v" in raw else hd_qk
    else:
        e.bad("head_dim", "is required (or head_dim_qk and head_dim_v)")

    # heads / GQA
    nq = e.int_field("num_q_heads", 1)
    nkv = e.int_field("num_kv_heads", 1)
    gqa = None
    if "gqa_ratio" in raw:
        gqa = e.int_field("gqa_ratio", 1, 64)
        if gqa is not None and nq is not None and nkv is not None and nq != gqa * nkv:
            e.bad("gqa_ratio", f"is {gqa} but num_q_heads/num_kv_heads = {nq}/{nkv}")
        elif gqa is not None and nq is not None and nkv is None and nq % gqa:
            e.bad("gqa_ratio", f"num_q_heads {nq} is not a multiple of gqa_ratio {gqa}")
    if nq is not None and nkv is not None:
        if nq % nkv:
            e.bad("num_q_heads", f"{nq} is not a multiple of num_kv_heads {nkv}")
        else:
            gqa = nq // nkv
    elif ("num_q_heads" in raw) != ("num_kv_heads" in raw) and "gqa_ratio" not in raw:
        e.bad("num_kv_heads" if "num_q_heads" in raw else "num_q_heads",
              "num_q_heads and num_kv_heads go together (or give gqa_ratio)")
    elif "gqa_ratio" not in raw and nq is None and nkv is None:
        e.bad("num_q_heads", "is required (with num_kv_heads), or give gqa_ratio")

    # mask: a built-in or named mask, or an expression
    mask = _mask_field(e)
    shown = "{expr: ...}" if isinstance(mask, N.Expr) else mask  # how messages name the mask
    doc_mask = None
    if mask == "document":
        doc_mask = e.choice("document_mask", INNER_MASKS, "causal")
    elif "document_mask" in raw and mask is not None:
        e.bad("document_mask", f"only applies to mask: document (mask is {shown!r})")
    windowed = mask == "sliding_window" or (mask == "document" and doc_mask == "sliding_window")
    window = e.int_field("window", 1)
    sink_window = None
    if mask == "sink_window":  # a constant of the expression (named.resolve), not the built-in's width
        windowed, sink_window, window = False, window, None
    elif windowed and "window" not in raw:
        e.bad("window", "is required for a sliding-window mask")
    if "window" in raw and not windowed and mask not in (None, "sink_window"):
        e.bad("window", f"only applies to sliding-window masks (mask is {shown!r})")
    align = e.choice("causal_alignment", ALIGNMENTS, "bottom_right")

    softcap = 0.0
    if raw.get("softcap") is not None:
        v = raw["softcap"]
        if not _is_num(v) or v < 0:
            e.bad("softcap", f"must be a finite number >= 0 (0 = off), got {v!r}")
        else:
            softcap = float(v)
    scale = None
    if raw.get("softmax_scale") is not None:
        v = raw["softmax_scale"]
        if not _is_num(v) or v <= 0:
            e.bad("softmax_scale", f"must be a finite number > 0, or null for 1/sqrt(head_dim_qk), got {v!r}")
        else:
            scale = float(v)

    dtypes = e.choices("dtypes", DTYPES, None, offered=IMPLEMENTED_DTYPES)
    targets = e.choices("targets", TARGETS, None)
    families = e.choices("families", ENTRY_FAMILIES, DEFAULT_FAMILIES)
    if dtypes and targets and "fp8_e4m3" in dtypes and "sm80" in targets:
        e.bad("dtypes", "fp8_e4m3 needs target sm90 only (sm80 has no fp8 tensor cores); "
              "split the entry or drop sm80 from targets")
    if dtypes and "fp8_e4m3" in dtypes and "families" in raw and families:
        no_fp8 = [f for f in families if f not in FP8_FAMILIES]
        if no_fp8:
            e.bad("families", f"{', '.join(no_fp8)}: fp8_e4m3 kernels are forward-only (inference); "
                  "give fp8_e4m3 an entry of its own with families: fwd (or leave families out)")
    x = entry_expressions(e, mask, softcap, dtypes, sink_window)
    if x is not None and "families" in raw and families and "prefill_paged" in families and (
            x.mask_expr or x.score_expr or x.sinks):
        e.bad("families", "prefill_paged: spec files do not build paged prefill kernels with expressions or "
                          "sinks yet (mask, score_mod, sinks; attention_varlen renders them on first use); leave it "
                          "out of this entry's families")
    if x is not None and x.window is not None:
        window = x.window  # a named mask that is the built-in sliding window (gpt_oss_swa)
    if len(problems) > start:
        return None
    return SpecEntry(name=name, source=path, head_dim_qk=hd_qk, head_dim_v=hd_v, gqa_ratio=gqa,
                     num_q_heads=nq, num_kv_heads=nkv, document_mask=doc_mask,
                     window=window, causal_alignment=align, softcap=softcap, softmax_scale=scale,
                     dtypes=dtypes, targets=targets, families=families, mask=x.mask,
                     mask_expr=x.mask_expr, score_expr=x.score_expr, params=x.params, sinks=x.sinks)


_MASK_REQUIRED = f"is required (one of {', '.join(MASKS)})"


def _mask_field(e: _Entry):
    """The mask as resolve takes it: a built-in or named mask's name, or N.Expr (None: a problem)."""
    v = e.raw.get("mask")
    if v is None:
        e.bad("mask", _MASK_REQUIRED)
        return None
    if isinstance(v, str) and (v in MASKS or v in N.MASK_NAMES):
        return v
    if isinstance(v, dict):
        return expr_mapping(e, "mask", v)
    e.bad("mask", f"must be one of {', '.join(MASKS)}, got {v!r}")
    return None


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load, except that a key given twice in one mapping is an error, not "last wins"
    (keys brought in by a `<<: *anchor` merge may still be overridden)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} is given twice in one mapping", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _unknown_field(key: Any, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(str(key), known, n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return f"unknown field ({hint}known: {', '.join(known)})"


def _yaml_where(exc: yaml.YAMLError) -> str:
    """' (line L, column C): what' for a YAML error. A bracket or quote left open is only noticed on
    a later line: then the line named is the one where it opens."""
    problem = getattr(exc, "problem", None) or str(exc)
    mark = getattr(exc, "problem_mark", None)
    context, start = getattr(exc, "context", None) or "", getattr(exc, "context_mark", None)
    opened = re.fullmatch(r"while (?:parsing|scanning) (an? (?:flow \w+|quoted scalar))", context)
    if opened and start is not None and (mark is None or start.line < mark.line):
        seen = f" on line {mark.line + 1}" if mark is not None else ""
        return (f" (line {start.line + 1}, column {start.column + 1}): {opened[1]} opens here and is "
                f"never closed ({problem}{seen})")
    if mark is None:
        return f": {problem}"
    return f" (line {mark.line + 1}, column {mark.column + 1}): {problem}"


def _check_file(text: str, path: str) -> tuple[SpecFile | None, list[str], dict[str, list[int]]]:
    """Parse and validate one file: (the SpecFile or None, every problem, entry name -> indices).
    The names come from every entry with a usable name, valid or not, so that a duplicate name is
    reported along with the entries' other problems."""
    try:
        raw = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        return None, [f"{path}: not valid YAML{_yaml_where(exc)}"], {}
    if not isinstance(raw, dict):
        return None, [f"{path}: the top level must be a mapping with a 'kernels' list"], {}
    problems: list[str] = []
    for key in raw:
        if key not in _TOP_FIELDS:
            problems.append(f"{path}: top level: field '{key}': {_unknown_field(key, _TOP_FIELDS)}")
    model = raw.get("model")
    if model is not None and not isinstance(model, str):
        problems.append(f"{path}: top level: field 'model': must be a string")
    if raw.get("description") is not None and not isinstance(raw["description"], str):
        problems.append(f"{path}: top level: field 'description': must be a string")
    kernels = raw.get("kernels")
    if not isinstance(kernels, list) or not kernels:
        problems.append(f"{path}: top level: field 'kernels': must be a non-empty list of kernel entries")
        return None, problems, {}
    entries = []
    names: dict[str, list[int]] = {}
    for i, item in enumerate(kernels):
        ent = _parse_entry(path, i, item, problems)
        if ent is not None:
            entries.append(ent)
        name = item.get("name") if isinstance(item, dict) else None
        if isinstance(name, str) and _NAME_RE.fullmatch(name):
            names.setdefault(name, []).append(i)
    for n, where in sorted(names.items()):
        if len(where) > 1:
            problems.append(f"{path}: kernel {n!r}: field 'name': used by more than one entry "
                            f"(entries {', '.join(map(str, where))})")
    if problems:
        return None, problems, names
    return SpecFile(path=path, model=model, entries=tuple(entries)), [], names


def parse_spec(text: str, path: str = "<string>") -> SpecFile:
    """Parse and validate one spec file's text. Raises SpecError listing every problem."""
    spec_file, problems, _ = _check_file(text, path)
    if problems:
        raise SpecError(problems)
    return spec_file


def _read(path: str | Path) -> tuple[str | None, list[str]]:
    try:
        return Path(path).read_text(), []
    except OSError as exc:
        return None, [f"{path}: cannot read: {exc.strerror or exc}"]
    except UnicodeDecodeError as exc:
        return None, [f"{path}: cannot read: not UTF-8 text ({exc.reason} at byte {exc.start})"]


def load_spec(path: str | Path) -> SpecFile:
    text, problems = _read(path)
    if problems:
        raise SpecError(problems)
    return parse_spec(text, str(path))


def spec_files(target: str | Path) -> list[Path]:
    """A spec file, or every *.yaml / *.yml in a folder (sorted)."""
    p = Path(target)
    if p.is_dir():
        files = sorted([*p.glob("*.yaml"), *p.glob("*.yml")])
        if not files:
            raise SpecError([f"{target}: no *.yaml spec files in this folder"])
        return files
    if not p.exists():
        raise SpecError([f"{target}: no such spec file or folder"])
    return [p]


def spec_label(path: str | Path) -> str:
    """How generated headers and manifests name a spec file: its folder and file name
    ("specs/llama.yaml"), whichever way the path was written (relative, absolute, with ".."), so
    that no machine path ends up in a generated file and the same file always gives the same bytes."""
    p = Path(os.path.abspath(path))
    return f"{p.parent.name}/{p.name}" if p.parent.name else p.name


def load_specs(targets: Sequence[str | Path]) -> list[SpecFile]:
    """Every spec file of `targets` (files or folders; a file named twice counts once), validated
    as one set. Raises one SpecError listing every problem of every file, plus what is wrong with
    the set: an entry name used in two files, two files with the same spec_label."""
    problems: list[str] = []
    paths: list[Path] = []
    seen: set[str] = set()
    for target in targets:
        try:
            found = spec_files(target)
        except SpecError as exc:
            problems += exc.problems
            continue
        for f in found:
            if os.path.abspath(f) not in seen:
                seen.add(os.path.abspath(f))
                paths.append(f)
    loaded: list[SpecFile] = []
    first_name: dict[str, tuple[str, int]] = {}  # entry name -> (file, index) that used it first
    first_label: dict[str, str] = {}
    for path in paths:
        text, read_problems = _read(path)
        problems += read_problems
        if text is None:
            continue
        spec_file, file_problems, names = _check_file(text, str(path))
        problems += file_problems
        if spec_file is not None:
            loaded.append(spec_file)
        label = spec_label(path)
        if label in first_label:
            problems.append(f"{path}: has the same folder and file name ({label}) as {first_label[label]}; "
                            "generated headers name a spec file by its folder and file name, so one "
                            "build cannot tell them apart (rename one)")
        else:
            first_label[label] = str(path)
        for name, indices in names.items():
            if name in first_name:
                other, j = first_name[name]
                problems.append(f"{path}: kernel {name!r} (entry {indices[0]}): field 'name': also used "
                                f"by {other} (entry {j}); entry names must be unique across the spec "
                                "files of one build")
            else:
                first_name[name] = (str(path), indices[0])
    if problems:
        raise SpecError(problems)
    return loaded
