"""Validation of a call's arguments, before any plan: every error names the argument. Also the
validated call's launch-time values (Options)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attngen.kernels.common import MAX_SEQLEN, MaskArgs, default_scale, mask_kind
from attngen.runtime import dispatch
from attngen.spec import MAX_HEAD_DIM

MIN_HEAD_DIM = 8


def _fail(msg: str) -> None:
    raise ValueError(msg)


def check_tensors(named: dict[str, torch.Tensor], ndim: int, shape_doc: str, dtypes=None) -> torch.dtype:
    """Common checks: tensors, same dtype (fp16/bf16, or one of `dtypes`), same device, rank."""
    dtype = device = None
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            _fail(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in (dtypes or dispatch.DTYPE_NAMES):
            _fail(f"{name}: unsupported dtype {t.dtype} (this entry point takes "
                  f"{' or '.join(str(d) for d in (dtypes or dispatch.DTYPE_NAMES))})")
        if t.dim() != ndim:
            _fail(f"{name}: expected {ndim} dims {shape_doc}, got shape {tuple(t.shape)}")
        if dtype is None:
            dtype, device, first = t.dtype, t.device, name
        elif t.dtype != dtype:
            _fail(f"{name}: dtype {t.dtype} differs from {first}'s {dtype}")
        elif t.device != device:
            _fail(f"{name}: on {t.device}, but {first} is on {device}")
    return dtype


def check_head_dims(dqk: int, dk: int, dv: int) -> None:
    if dqk != dk:
        _fail(f"k: head dim {dk} differs from q's {dqk}")
    for name, d in (("q", dqk), ("v", dv)):
        if d > MAX_HEAD_DIM:
            _fail(f"{name}: head dim {d} is above the supported maximum {MAX_HEAD_DIM}")
        if d < MIN_HEAD_DIM:
            _fail(f"{name}: head dim {d} is below the supported minimum {MIN_HEAD_DIM}")


def check_heads(hq: int, hkv: int, hv: int, dqk: int, dk: int, dv: int) -> None:
    if hv != hkv:
        _fail(f"v: {hv} heads, k has {hkv}")
    if hkv == 0 or hq % hkv:
        _fail(f"q: {hq} query heads is not a multiple of the {hkv} KV heads of k/v")
    check_head_dims(dqk, dk, dv)


def check_options(window_size, softcap, scale) -> tuple[int, int]:
    if (not isinstance(window_size, (tuple, list)) or len(window_size) != 2
            or not all(isinstance(w, int) and not isinstance(w, bool) for w in window_size)):
        _fail(f"window_size: expected (left, right) ints, -1 = unbounded; got {window_size!r}")
    if min(window_size) < -1:
        _fail(f"window_size: sides must be >= 0 or -1 (unbounded), got {tuple(window_size)}")
    if not isinstance(softcap, (int, float)) or softcap < 0:
        _fail(f"softcap: must be a number >= 0 (0 = off), got {softcap!r}")
    if scale is not None and (not isinstance(scale, (int, float)) or scale <= 0):
        _fail(f"scale: must be a number > 0 or None, got {scale!r}")
    return int(window_size[0]), int(window_size[1])


def check_alignment(causal_alignment: str) -> bool:
    if causal_alignment not in ("bottom_right", "top_left"):
        _fail(f"causal_alignment: must be 'bottom_right' or 'top_left', got {causal_alignment!r}")
    return causal_alignment == "top_left"



def check_layout(layout) -> None:
    if layout not in ("bhsd", "bshd"):
        _fail(f"layout: must be 'bhsd' or 'bshd', got {layout!r}")


@dataclass(frozen=True)
class Options:
    """A validated call's launch-time values (hashable: part of every plan key)."""

    mask: str  # "none" | "causal" | "sliding_window"
    scale: float
    softcap: float
    window_left: int
    window_right: int
    top_left: bool
    layout: str  # "bhsd" | "bshd" | "packed"
    # expressions (attngen.runtime.exprs.ExprSpec): mask / score expressions, parameters, sinks
    expr: object = None

    @property
    def window(self) -> int | None:
        """Keys one query sees at most under a sliding-window mask (None for other masks)."""
        if self.mask != "sliding_window":
            return None
        return self.window_left + self.window_right + 1  # an unbounded side counts UNBOUNDED keys

    @property
    def mask_args(self) -> MaskArgs:
        return MaskArgs(scale=self.scale, softcap=self.softcap, window_left=self.window_left,
                        window_right=self.window_right, align_top_left=self.top_left)


def make_options(head_dim: int, causal, window_size, softcap, scale, causal_alignment, layout) -> Options:
    left, right = check_options(window_size, softcap, scale)
    top_left = check_alignment(causal_alignment)
    mask, wl, wr = mask_kind(bool(causal), (left, right))
    return Options(mask, float(scale) if scale is not None else default_scale(head_dim),
                   float(softcap), wl, wr, top_left, layout)


def output_shapes(q, v, layout: str) -> tuple[tuple, tuple]:
    """(out, lse) shapes of a call in the caller's layout: out like q with v's head dim; lse
    (B, Hq, Sq), or (Hq, total_q) for packed documents."""
    if layout == "packed":
        return (q.shape[0], q.shape[1], v.shape[2]), (q.shape[1], q.shape[0])
    if layout == "bshd":
        return (q.shape[0], q.shape[1], q.shape[2], v.shape[3]), (q.shape[0], q.shape[2], q.shape[1])
    return (q.shape[0], q.shape[1], q.shape[2], v.shape[3]), (q.shape[0], q.shape[1], q.shape[2])


def dense_views(q, k, v, layout: str):
    """(B, H, S, D) views of the user's tensors (no copies)."""
    if layout == "bshd":
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    return q, k, v


def check_dense(q, k, v, layout: str) -> torch.dtype:
    check_layout(layout)
    dtype = check_tensors({"q": q, "k": k, "v": v}, 4,
                          "(B, H, S, D)" if layout == "bhsd" else "(B, S, H, D)")
    qv, kv, vv = dense_views(q, k, v, layout)
    B, Hq, Sq, D = qv.shape
    Bk, Hkv, Sk, Dk = kv.shape
    Bv, Hv, Sv, Dv = vv.shape
    if Bk != B or Bv != B:
        _fail(f"k, v: batch sizes {Bk}, {Bv} differ from q's {B}")
    if Sv != Sk:
        _fail(f"v: sequence length {Sv} differs from k's {Sk}")
    check_heads(Hq, Hkv, Hv, D, Dk, Dv)
    for name, n in (("q", Sq), ("k", Sk)):
        if n > MAX_SEQLEN:
            _fail(f"{name}: sequence length {n} is above the kernels' maximum {MAX_SEQLEN} (2^30 - "
                  f"1024: their mask bounds are int32); split the sequence into several calls")
    return dtype


def check_cu_seqlens(name: str, cu: torch.Tensor, host: torch.Tensor, total: int,
                     device: torch.device) -> int:
    """Validate cu_seqlens (`host` is its CPU copy); returns the number of documents."""
    if cu.device != device:
        _fail(f"{name}: on {cu.device}, but q is on {device}")
    if int(host[0]) != 0:
        _fail(f"{name}: must start at 0, starts at {int(host[0])}")
    if int(host[-1]) != total:
        _fail(f"{name}: must end at the packed length {total}, ends at {int(host[-1])}")
    if cu.numel() > 1 and bool((host[1:] < host[:-1]).any()):
        i = int((host[1:] < host[:-1]).nonzero()[0])
        _fail(f"{name}: must be non-decreasing, but entry {i + 1} ({int(host[i + 1])}) < entry {i} "
              f"({int(host[i])})")
    return cu.numel() - 1


def _cu_metadata(name: str, cu) -> None:
    if not isinstance(cu, torch.Tensor):
        _fail(f"{name}: expected an int32 torch.Tensor, got {type(cu).__name__}")
    if cu.dtype != torch.int32:
        _fail(f"{name}: must be torch.int32, got {cu.dtype}")
    if cu.dim() != 1 or cu.numel() < 1:
        _fail(f"{name}: must be 1-D with num_docs + 1 entries, got shape {tuple(cu.shape)}")


def _check_cu_values(cu_q, cu_k, Tq, Tk, max_seqlen_q, max_seqlen_k, device) -> None:
    host = torch.cat([cu_q.to(cu_k.device), cu_k]).cpu()  # one device-to-host copy
    host_q, host_k = host[:cu_q.numel()], host[cu_q.numel():]
    check_cu_seqlens("cu_seqlens_q", cu_q, host_q, Tq, device)
    check_cu_seqlens("cu_seqlens_k", cu_k, host_k, Tk, device)
    for name, mx, h in (("max_seqlen_q", max_seqlen_q, host_q), ("max_seqlen_k", max_seqlen_k, host_k)):
        if not isinstance(mx, int) or isinstance(mx, bool) or mx < 0:
            _fail(f"{name}: must be an int >= 0, got {mx!r}")
        lens = h[1:] - h[:-1]
        if lens.numel() and int(lens.max()) > mx:
            _fail(f"{name}: {mx} is below the longest document ({int(lens.max())})")




def check_cu_values(cu_q, cu_k, Tq, Tk, max_seqlen_q, max_seqlen_k, device) -> None:
    """Value checks need the values on the host (a device sync). A training step passes the same
    cu_seqlens to every layer, so a tensor that passed once is not checked again until it is
    modified in place (its version counter moves) or used with other sizes. Runs inside the op's
    implementation, never on a traced path."""
    key = (id(cu_q), id(cu_k), cu_q._version, cu_k._version, Tq, Tk, max_seqlen_q, max_seqlen_k)
    if getattr(cu_q, "_attngen_checked", None) != key or getattr(cu_k, "_attngen_checked", None) != key:
        _check_cu_values(cu_q, cu_k, Tq, Tk, max_seqlen_q, max_seqlen_k, device)
        cu_q._attngen_checked = cu_k._attngen_checked = key


def check_varlen(q, k, v, cu_q, cu_k, max_q, max_k) -> torch.dtype:
    dtype = check_tensors({"q": q, "k": k, "v": v}, 3, "(total, H, D)")
    Tq, Hq, D = q.shape
    Tk, Hkv, Dk = k.shape
    Tv, Hv, Dv = v.shape
    if Tv != Tk:
        _fail(f"v: packed length {Tv} differs from k's {Tk}")
    check_heads(Hq, Hkv, Hv, D, Dk, Dv)
    _cu_metadata("cu_seqlens_q", cu_q)
    _cu_metadata("cu_seqlens_k", cu_k)
    if cu_k.numel() != cu_q.numel():
        _fail(f"cu_seqlens_k: {cu_k.numel() - 1} documents, cu_seqlens_q has {cu_q.numel() - 1}")
    for name, mx in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
        if not isinstance(mx, int) or isinstance(mx, bool) or mx < 0:
            _fail(f"{name}: must be an int >= 0, got {mx!r}")
        if mx > MAX_SEQLEN:
            _fail(f"{name}: {mx} is above the kernels' longest document {MAX_SEQLEN} (2^30 - 1024: "
                  f"their mask bounds are int32); split the document")
    return dtype
