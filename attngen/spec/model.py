"""The spec language's vocabulary and its frozen objects: KernelSpec (one concrete kernel, the object
that travels through codegen, tuning, the database and the runtime), SpecEntry (one validated
``kernels:`` entry of a spec file), SpecFile, SpecError. YAML loading and its validation are in
attngen.spec.loading."""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any

MASKS = ("none", "causal", "sliding_window", "document")
INNER_MASKS = ("none", "causal", "sliding_window")  # what a KernelSpec's mask can be
ALIGNMENTS = ("bottom_right", "top_left")
DTYPES = ("fp16", "bf16", "fp8_e4m3")
TARGETS = ("sm80", "sm90")
# kernel families; a spec file's `families:` names ENTRY_FAMILIES, fp8_e4m3 entries get fwd_fp8
# (the forward with fp8 operands, attngen.families.fwd_fp8) for their "fwd"; prefill_paged
# (chunked prefill on a paged KV cache) goes, like decode, to entries that are no packed-document
# entry, and only to those without expressions or sinks
FAMILIES = ("fwd", "bwd", "decode", "fwd_fp8", "prefill_paged")
ENTRY_FAMILIES = ("fwd", "bwd", "decode", "prefill_paged")
CACHE_FAMILIES = ("decode", "prefill_paged")  # the families that read a KV cache, never packed documents
FP8_FAMILIES = {"fwd": "fwd_fp8"}  # what an fp8_e4m3 entry's family becomes (the others have none)
IMPLEMENTED_DTYPES = DTYPES
MAX_HEAD_DIM = 256
MIN_HEAD_DIM = 8  # any head dim from 8 to 256: tiles pad to a power of two >= 16

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")  # used with fullmatch: no trailing "\n"


class SpecError(ValueError):
    """One or more problems in a spec file; each line names the file, the entry and the field."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


@dataclass(frozen=True)
class KernelSpec:
    """One concrete kernel. Equal specs generate byte-identical code."""

    family: str  # "fwd" | "bwd" | "decode" | "fwd_fp8" | "prefill_paged"
    dtype: str  # "fp16" | "bf16" | "fp8_e4m3"
    target: str  # "sm80" | "sm90"
    head_dim_qk: int
    head_dim_v: int
    gqa_ratio: int  # query heads per KV head
    mask: str  # "none" | "causal" | "sliding_window" (inside each document when varlen)
    softcap: bool = False  # tanh softcapping code present
    varlen: bool = False  # packed documents addressed through cu_seqlens
    # expressions (attngen.spec.expr, canonical text; "" = none): a mask expression replaces the
    # built-in mask (mask is then "none"), a score modification replaces softcapping
    mask_expr: str = ""
    score_expr: str = ""
    params: tuple = ()  # ParamDecl of the parameters the expressions use
    sinks: bool = False  # a learned per-head logit joins every row's softmax denominator

    @property
    def has_expr(self) -> bool:
        return bool(self.mask_expr or self.score_expr or self.sinks)

    @property
    def expr_hash(self) -> str:
        """Short hash of the expressions, parameters and sinks (part of the uri)."""
        import hashlib

        text = "|".join([self.mask_expr, self.score_expr, ";".join(p.text() for p in self.params),
                         str(self.sinks)])
        return hashlib.sha256(text.encode()).hexdigest()[:8]

    def __post_init__(self) -> None:
        if not isinstance(self.params, tuple) or any(not hasattr(p, "learnable") for p in self.params):
            # from a manifest's JSON: a list of dicts
            from attngen.spec.expr import ParamDecl

            decls = tuple(p if hasattr(p, "learnable") else ParamDecl(p["name"], tuple(p["shape"]), p["dtype"],
                                                                     p["learnable"]) for p in self.params)
            object.__setattr__(self, "params", decls)
        problems = _check_kernel_spec(self)
        if problems:
            raise ValueError("invalid KernelSpec: " + "; ".join(problems))

    @property
    def uri(self) -> str:
        """Readable name: family, dtype, head dims, GQA, mask, target (no hash)."""
        hd = f"hd{self.head_dim_qk}" if self.head_dim_qk == self.head_dim_v else (
            f"hd{self.head_dim_qk}x{self.head_dim_v}")
        mask = {"none": "full", "causal": "causal", "sliding_window": "swa"}[self.mask]
        if self.varlen:
            mask = f"doc_{mask}"
        # fwd_fp8 kernels: attn_fwd_fp8_e4m3_..., not attn_fwd_fp8_fp8_e4m3_...
        dtype = self.dtype.removeprefix("fp8_") if self.family.endswith("_fp8") else self.dtype
        parts = ["attn", self.family, dtype, hd, f"gqa{self.gqa_ratio}", mask]
        if self.softcap:
            parts.append("softcap")
        if self.has_expr:
            parts.append(("sinks_" if self.sinks else "") + "x" + self.expr_hash)
        parts.append(self.target)
        return "_".join(parts)

    @property
    def pad_qk(self) -> int:
        """head_dim_qk as the kernel's tiles hold it: a power of two (tl.arange), at least 16
        (tl.dot); the extra columns are masked."""
        return max(16, 1 << (self.head_dim_qk - 1).bit_length())

    @property
    def pad_v(self) -> int:
        return max(16, 1 << (self.head_dim_v - 1).bit_length())

    def head_chunks(self, which: str, policy: str = "split") -> tuple[tuple[int, int], ...]:
        """(offset, width) column tiles that hold head dim `which` ("qk" or "v") in the forward.
        policy "split": a head dim whose multiple of 16 is a sum of two powers of two is held as
        those two tiles (80 = 64 + 16, 96 = 64 + 32, 192 = 128 + 64, 72 -> 64 + 16 with 8 columns
        masked) instead of one padded power-of-two tile, so no matmul works on padding; everything
        else is one tile of pad_qk / pad_v columns (extra columns masked). policy "pad": always one
        tile (the A/B baseline)."""
        return head_chunks(self.head_dim_qk if which == "qk" else self.head_dim_v, policy)

    def stamp_fields(self) -> dict[str, Any]:
        """The fields a generated module's KERNEL_SPEC records: the expression fields only where the
        spec has them (the other kernels' stamps and hashes stay as before expressions), parameters
        as (name, shape, dtype, learnable) tuples."""
        extra = ("mask_expr", "score_expr", "params", "sinks")
        out = {}
        for f in dataclasses.fields(self):
            if f.name in extra and not self.has_expr:
                continue
            v = getattr(self, f.name)
            out[f.name] = tuple((d.name, d.shape, d.dtype, d.learnable) for d in v) if f.name == "params" else v
        return out

    def replace(self, **changes: Any) -> "KernelSpec":
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def head_chunks(dim: int, policy: str = "split") -> tuple[tuple[int, int], ...]:
    """See KernelSpec.head_chunks."""
    if policy not in ("split", "pad"):
        raise ValueError(f"head chunk policy must be 'split' or 'pad', got {policy!r}")
    pad = max(16, 1 << (dim - 1).bit_length())
    d16 = -(-dim // 16) * 16
    bits = [1 << b for b in range(d16.bit_length() - 1, -1, -1) if d16 & (1 << b)]
    if policy == "pad" or len(bits) != 2:
        return ((0, pad),)
    return ((0, bits[0]), (bits[0], bits[1]))


def _check_kernel_spec(k: KernelSpec) -> list[str]:
    p = []
    if k.family not in FAMILIES:
        p.append(f"family must be one of {FAMILIES}, got {k.family!r}")
    if k.family in CACHE_FAMILIES and k.varlen:
        p.append(f"{k.family} kernels read a KV cache, not packed documents (varlen)")
    if k.dtype not in DTYPES:
        p.append(f"dtype must be one of {DTYPES}, got {k.dtype!r}")
    if k.target not in TARGETS:
        p.append(f"target must be one of {TARGETS}, got {k.target!r}")
    for name in ("head_dim_qk", "head_dim_v"):
        v = getattr(k, name)
        if not _is_int(v) or not MIN_HEAD_DIM <= v <= MAX_HEAD_DIM:
            p.append(f"{name} must be an integer in [{MIN_HEAD_DIM}, {MAX_HEAD_DIM}], got {v!r}")
    if not _is_int(k.gqa_ratio) or k.gqa_ratio < 1:
        p.append(f"gqa_ratio must be an integer >= 1, got {k.gqa_ratio!r}")
    if k.mask not in INNER_MASKS:
        p.append(f"mask must be one of {INNER_MASKS}, got {k.mask!r}")
    if k.has_expr:
        p.extend(_check_expr(k))
    if k.dtype == "fp8_e4m3" and k.target == "sm80":
        p.append("fp8_e4m3 needs target sm90 (sm80 has no fp8 tensor cores)")
    if (k.family == "fwd_fp8") != (k.dtype == "fp8_e4m3") and k.family in FAMILIES and k.dtype in DTYPES:
        p.append(f"family fwd_fp8 and dtype fp8_e4m3 go together (got {k.family} / {k.dtype})")
    return p


def _check_expr(k: KernelSpec) -> list[str]:
    from attngen.spec import expr as X

    p = []
    if k.family == "fwd_fp8":
        p.append("fp8 kernels take no expressions or sinks")
    if k.mask_expr and k.mask != "none":
        p.append("a mask expression replaces the built-in mask (mask must be 'none')")
    if k.score_expr and k.softcap:
        p.append("a score modification replaces softcapping (softcap must be off)")
    params = {d.name: d for d in k.params}
    for text, kind in ((k.mask_expr, "mask"), (k.score_expr, "score")):
        if text:
            try:
                X.parse(text, kind, params)
            except X.ExprError as e:
                p.extend(f"{kind} expression: {x}" for x in e.problems)
    return p


@dataclass(frozen=True)
class SpecEntry:
    """One ``kernels:`` entry of a spec file, validated."""

    name: str
    source: str  # the spec file, as given
    head_dim_qk: int
    head_dim_v: int
    gqa_ratio: int
    num_q_heads: int | None
    num_kv_heads: int | None
    mask: str  # one of MASKS
    document_mask: str | None  # inner mask of a document entry
    window: int | None  # sliding window width in keys, the query itself included
    causal_alignment: str
    softcap: float
    softmax_scale: float | None
    dtypes: tuple[str, ...]
    targets: tuple[str, ...]
    families: tuple[str, ...]
    # expressions (attngen.spec.named.resolve): as KernelSpec carries them; "" / () / False = none
    mask_expr: str = ""
    score_expr: str = ""
    params: tuple = ()
    sinks: bool = False

    def kernel_specs(self) -> list[KernelSpec]:
        """Expand over families x dtypes x targets, in a fixed order."""
        inner = self.document_mask if self.mask == "document" else self.mask
        out = []
        for family in self.families:
            if family in CACHE_FAMILIES and self.mask == "document":
                continue  # decoding and paged prefill read a KV cache, never packed documents
            if family == "prefill_paged" and (self.mask_expr or self.score_expr or self.sinks):
                continue  # no expressions in the paged prefill kernels yet (loading rejects asking for it)
            for dtype in self.dtypes:
                kind = FP8_FAMILIES.get(family) if dtype == "fp8_e4m3" else family
                if kind is None:
                    continue  # fp8 kernels are forward-only (a default family list keeps bwd for the others)
                for target in self.targets:
                    out.append(KernelSpec(
                        family=kind, dtype=dtype, target=target, head_dim_qk=self.head_dim_qk,
                        head_dim_v=self.head_dim_v, gqa_ratio=self.gqa_ratio, mask=inner,
                        softcap=self.softcap > 0, varlen=self.mask == "document", mask_expr=self.mask_expr,
                        score_expr=self.score_expr, params=self.params, sinks=self.sinks))
        return out


@dataclass(frozen=True)
class SpecFile:
    path: str
    model: str | None
    entries: tuple[SpecEntry, ...]

    def kernel_specs(self) -> list[KernelSpec]:
        return [k for e in self.entries for k in e.kernel_specs()]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    """A finite int or float (YAML's .nan / .inf and ints too big for a float are not numbers here)."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False
