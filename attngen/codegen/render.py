"""Render one KernelSpec into Triton source with the Jinja templates in ``templates/``."""

from __future__ import annotations

import functools
from pathlib import Path

import jinja2

from attngen.codegen import exprgen
from attngen import env
from attngen._version import __version__
from attngen.codegen.hashing import templates_hash
from attngen.codegen.naming import FAMILY_TEMPLATES, kernel_hash
from attngen.families import family
from attngen.spec import IMPLEMENTED_DTYPES, KernelSpec


class CodegenError(RuntimeError):
    pass


@functools.lru_cache(maxsize=None)
def _environment(root: str) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(root),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=False,
        lstrip_blocks=False,
        autoescape=False,
    )


def template_name(spec: KernelSpec) -> str:
    return _family_template(spec.family)


def _family_template(family: str) -> str:
    try:
        return FAMILY_TEMPLATES[family]
    except KeyError:
        raise CodegenError(f"no template for kernel family {family!r}") from None


def template_hash(spec: KernelSpec, root: Path | None = None) -> str:
    """Hash of the family template and every shared partial it imports, directly or through
    another partial (so a partial only the forward uses leaves the backward's hash, and its tuned
    winners, alone)."""
    return family_template_hash(spec.family, root)


def family_template_hash(family: str, root: Path | None = None) -> str:
    """template_hash of every kernel of `family` (the hash depends on the family only)."""
    root = root or env.templates_dir()
    family = _family_template(family)
    names = [family, *sorted(set(_imported(family, Path(root))) - {family})]
    return templates_hash(root, names)


def _imported(name: str, root: Path, seen: set | None = None) -> set:
    """`name` and the templates it imports or includes, transitively (Jinja's own parser)."""
    from jinja2 import meta

    seen = set() if seen is None else seen
    if name in seen:
        return seen
    seen.add(name)
    path = root / name
    st = path.stat()
    key = (str(path), st.st_mtime_ns, st.st_size)
    deps = _REFS.get(key)
    if deps is None:  # Jinja's parse of a template, once per file version (a build renders hundreds)
        deps = tuple(meta.find_referenced_templates(_environment(str(root)).parse(path.read_text())))
        _REFS[key] = deps
    for dep in deps:
        if dep is None:
            raise CodegenError(f"templates/{name}: imports a template whose name is computed; "
                               "the template hash needs literal names")
        _imported(dep, root, seen)
    return seen


# (template path, mtime, size) -> the templates it references
_REFS: dict = {}


def next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def kernel_spec_repr(spec: KernelSpec) -> str:
    fields = ", ".join(f"{k}={v!r}" for k, v in spec.stamp_fields().items())
    return f"dict({fields})"


def _check_sources(spec: KernelSpec, sources: tuple[str, ...]) -> None:
    """Sources go into one header comment line each and must name no machine path (the same spec
    gives the same bytes on every machine): "<folder>/<file>#<entry> (sha256 ...)"."""
    for src in sources:
        if "\n" in src or "\r" in src or src.startswith(("/", "\\")) or src[1:3] in (":/", ":\\"):
            raise CodegenError(f"{spec.uri}: source {src!r} is not '<folder>/<file>#<entry> (sha256 ...)' "
                               "(no line breaks, no absolute paths)")


def strides_follow_lengths(spec: KernelSpec) -> bool:
    """Whether a batch / head / sequence stride changes its divisibility by 16 with a sequence
    length: when a head dim is not a multiple of 16 (S * D). The templates' entry points then leave
    those strides unspecialized (role "stride", templates/_common.py.jinja); with multiples of 16
    they stay specialized (always divisible, and the compiler may use it for wide loads). Ints that
    follow lengths (role "length") are never specialized; head-dim strides always are."""
    return not (spec.head_dim_qk % 16 == 0 and spec.head_dim_v % 16 == 0)


def column_tiles(spec: KernelSpec, which: str, policy: str = "split") -> list[dict]:
    """The forward's head-dim tiles of `which` ("qk" / "v") as the templates use them: name suffix
    ("" for a single tile, else its index), column offset, width (a power of two) and the columns
    in use (fewer than width only in the last tile)."""
    dim = spec.head_dim_qk if which == "qk" else spec.head_dim_v
    tiles = spec.head_chunks(which, policy)
    return [{"sfx": "" if len(tiles) == 1 else str(i), "off": off, "width": w, "used": min(w, dim - off)}
            for i, (off, w) in enumerate(tiles)]


def template_context(spec: KernelSpec, sources: tuple[str, ...] = (), root: Path | None = None,
                     options: dict | None = None) -> dict:
    """Everything the templates read. options: codegen choices for A/B runs
    (benchmarks/tools/fwd_ab.py, bwd_ab.py; varlen_ab.py, removed: in git at 486282c): {"head_chunks":
    "split" | "pad", "dp_first": "auto" | "on" | "off", "doc_guard": "auto" | "desc" | "zero" | "off",
    "tile_order": "grouped" | "lpt", "dkdv_order": "grouped" | "lpt", "dq_reverse": "off" | "on",
    "fp8_perm": "on" | "off", "fp8_rot_tile": 0 | 64 | ..., "ws_doc_desc": "producer" | "shared"};
    the build always uses the defaults. (ws_dq, dQ inside the Gluon dK/dV pass, was measured and
    removed: docs/notes.md. decode_combine, the decode merge inside the split kernel, became the
    decode config's `merge` field and the kernel's FUSED constexpr in session 61.)"""
    options = options or {}
    policy = options.get("head_chunks", "split")
    # the dK/dV pass issues dO.V^T before the softmax of P where registers allow (measured: hd64
    # +4-5 %, hd128 up to -24 % under spills; benchmarks/README.md)
    dp_first = {"auto": spec.pad_qk <= 64, "on": True, "off": False}[options.get("dp_first", "auto")]
    doc_guard = _doc_guard(spec, options.get("doc_guard", "auto"))
    # the Triton forward TMA kernel's and the Gluon backward passes' program order: "grouped" (the
    # blocks of one (batch, head) or document side by side, sharing K / V in L2) or "lpt" (every
    # one's heaviest block first; measured for the backward: docs/hopper_recipe.md, item 7)
    tile_order = options.get("tile_order", "grouped")
    # the Triton dQ passes under a mask: heaviest query blocks (the last ones) first
    dq_reverse = {"on": True, "off": False}[options.get("dq_reverse", "off")]
    if options.get("ws_doc_desc", "producer") not in ("producer", "shared"):
        raise CodegenError(f"{spec.uri}: ws_doc_desc={options['ws_doc_desc']!r} is not one of producer, shared")
    root = root or env.templates_dir()
    _check_sources(spec, sources)
    stamp = {
        "version": __version__,
        "uri": spec.uri,
        "family": spec.family,
        "sources": list(sources),
        "template": f"templates/{template_name(spec)}",
        "template_hash": template_hash(spec, root),
        "kernel_spec": kernel_spec_repr(spec),
        "kernel_hash": "",  # render() fills it in: the hash of the module rendered without it
    }
    fam = family(spec.family)
    return {
        **(fam.context(spec) if fam.context else {}),
        "spec": spec,
        "stamp": stamp,
        "pad_qk": spec.pad_qk,
        "pad_v": spec.pad_v,
        "qk_tiles": column_tiles(spec, "qk", policy),
        "v_tiles": column_tiles(spec, "v", policy),
        # the pointer kernel's: one padded tile (its two-tile form miscompiles on Hopper with Triton
        # 3.6; templates/attn_fwd.py.jinja)
        "ptr_qk_tiles": column_tiles(spec, "qk", "pad"),
        "ptr_v_tiles": column_tiles(spec, "v", "pad"),
        "strides_follow_lengths": strides_follow_lengths(spec),
        "kernel_spec_repr": kernel_spec_repr(spec),
        "dp_first": dp_first,
        "doc_desc": doc_guard == "desc",
        "doc_zero": doc_guard == "zero",
        # the optional kernels the family gives this spec (Family.variants): the Gluon kernels
        "ws_fwd": spec.family == "fwd" and family("fwd").variants(spec)["ws"],
        "ws_bwd": spec.family == "bwd" and family("bwd").variants(spec)["ws"],
        "tile_order": tile_order,
        # the Gluon dK/dV pass's program order alone (codegen option dkdv_order). Default: "lpt"
        # under a causal mask on dense batches (a key block's work falls with its index: every
        # head's first block first; H100, GQA 32/8 causal S8192 405 -> 456 TFLOP/s, the pass 2034
        # -> 1681 us, benchmarks/ab/h100_ab_bwd_dkdv_lpt_2026-12-07.json), else tile_order
        "dkdv_order": options.get("dkdv_order", "lpt" if spec.mask == "causal" and not spec.varlen else tile_order),
        # the Gluon backward passes over packed documents: the per-document descriptors the
        # producer warp loads through are made in the producer partition, which fences them for
        # its own loads ("producer": the tensormap proxy's acquire orders only the executing
        # thread's reads; docs/notes.md, sessions 60-61), or only in the entry before the
        # partitions start ("shared": one warp of the first consumer makes them and fences them
        # for itself, so the producer's copies may read a stale descriptor); the build renders
        # "producer"
        "ws_doc_producer": options.get("ws_doc_desc", "producer") == "producer",
        # expressions (attngen.codegen.exprgen): the fragments' helper and this spec's names; the
        # sm90 TMA / Gluon kernels take no expressions yet (the pointer kernels serve them)
        "xg": exprgen,
        "x": exprgen.fragments(spec),
        "tma_kernels": spec.target == "sm90",
        "dq_reverse": dq_reverse,
        # the fp8 Gluon kernel's P to P.V's operand: through the key reorder (the prologue's PERM16)
        # or a layout conversion (A/B; the caller then runs the prologue without PERM16)
        "fp8_perm": options.get("fp8_perm", "on") == "on",
        **({"rot_tile": int(options["fp8_rot_tile"])} if "fp8_rot_tile" in options else {}),
    }


# How the sm90 TMA kernels keep packed documents apart (a tile that runs past its document's end
# must not bring the next document's rows into a product with a masked-out P or dS: 0 * inf is
# NaN); the first of each family's tuple is its default. "zero": host descriptors over the whole
# packed tensor, the rows past the end zeroed in registers in the masked stages. "desc" (backward):
# descriptors made in the kernel over the document's own rows (the copy engine zero-fills past its
# end, nothing to zero) -- measured slower than "zero" on the H200 (backward-only 205 vs 216 and
# 249 vs 255 TFLOP/s, h200_ab_varlen_desc_2026-12-01.json), kept for A/B runs and as the way in for
# paged KV. "off": neither (A/B runs only: a neighbour's NaN leaks).
DOC_GUARDS = {"fwd": ("zero", "off"), "bwd": ("zero", "desc", "off")}


def _doc_guard(spec: KernelSpec, choice: str) -> str:
    allowed = DOC_GUARDS.get(spec.family, ("off",))
    if choice == "auto":
        return allowed[0]
    if choice not in allowed:
        raise CodegenError(f"{spec.uri}: doc_guard={choice!r} is not one of {', '.join(allowed)} "
                           f"for the {spec.family} family")
    return choice


def render(spec: KernelSpec, sources: tuple[str, ...] = (), root: Path | None = None,
           options: dict | None = None) -> str:
    """Source of the module for `spec`. `sources` ("file#entry (sha256 ...)") go in the header;
    `options`: codegen choices for A/B runs (template_context), never used by the build."""
    if spec.dtype not in IMPLEMENTED_DTYPES:
        raise CodegenError(f"{spec.uri}: {spec.dtype} kernels are not implemented yet "
                           f"(implemented: {', '.join(IMPLEMENTED_DTYPES)})")
    root = root or env.templates_dir()
    name = template_name(spec)
    if not (root / name).is_file():
        raise CodegenError(f"{spec.uri}: kernel family {spec.family!r} is not implemented yet "
                           f"(no template {name} in {root})")
    tmpl = _environment(str(root)).get_template(name)
    context = template_context(spec, sources, root, options)
    # the stamp's kernel hash covers everything but the stamp: rendered once without it, once with
    text = _render(tmpl, context)
    context["stamp"]["kernel_hash"] = kernel_hash(text)
    return _render(tmpl, context)


def _render(tmpl: jinja2.Template, context: dict) -> str:
    text = tmpl.render(**context)
    return "\n".join(line.rstrip() for line in text.splitlines()) + "\n"
