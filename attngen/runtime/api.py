"""`attngen.attention`: validate a call, pick and load the generated kernel, launch it."""

from __future__ import annotations

import torch

from attngen import env
from attngen.kernels.common import MaskArgs, default_scale, mask_kind
from attngen.kernels.fwd import attn_fwd
from attngen.runtime import dispatch, loader
from attngen.spec import MAX_HEAD_DIM, KernelSpec


def _fail(msg: str) -> None:
    raise ValueError(msg)


def check_tensors(named: dict[str, torch.Tensor], ndim: int, shape_doc: str) -> torch.dtype:
    """Common checks: tensors, same dtype (fp16/bf16), same device, rank."""
    dtype = device = None
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            _fail(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in dispatch.DTYPE_NAMES:
            _fail(f"{name}: unsupported dtype {t.dtype} (attngen kernels take torch.float16 or "
                  f"torch.bfloat16)")
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
        if d < 16 or d % 8:
            _fail(f"{name}: head dim {d} must be a multiple of 8, at least 16")


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


def kernel_for(family: str, dtype: torch.dtype, device: torch.device, dqk: int, dv: int, gqa: int,
               mask: str, softcap: float, varlen: bool) -> tuple[KernelSpec, bool]:
    """(spec, interpret) for a validated call."""
    interpret = env.interpreting()
    if device.type not in ("cpu", "cuda"):
        _fail(f"q: device {device} is not supported (cuda, or cpu through Triton's interpreter)")
    if device.type == "cpu" and not interpret:
        _fail("q: CPU tensors run through Triton's interpreter, which is off in this process: set "
              "TRITON_INTERPRET=1 before importing attngen/triton, or move the tensors to a GPU")
    spec = KernelSpec(family=family, dtype=dispatch.DTYPE_NAMES[dtype],
                      target=dispatch.device_target(device), head_dim_qk=dqk, head_dim_v=dv,
                      gqa_ratio=gqa, mask=mask, softcap=softcap > 0, varlen=varlen)
    if interpret and dtype == torch.bfloat16:
        from attngen.interp import patch_bf16_dot

        patch_bf16_dot()
    return spec, interpret


def attention(q, k, v, *, causal=False, window_size=(-1, -1), softcap=0.0, scale=None,
              layout="bhsd", return_lse=False, causal_alignment="bottom_right"):
    """Scaled dot-product attention through attngen's generated Triton kernels.

    q (B, Hq, Sq, D), k/v (B, Hkv, Sk, D) with layout="bhsd" (as SDPA); (B, S, H, D) with
    layout="bshd" (as flash-attn). Returns out in q's layout, and with return_lse the fp32
    logsumexp (B, Hq, Sq). CPU tensors run through Triton's interpreter (slow; for tests).
    """
    if layout not in ("bhsd", "bshd"):
        _fail(f"layout: must be 'bhsd' or 'bshd', got {layout!r}")
    dtype = check_tensors({"q": q, "k": k, "v": v}, 4,
                          "(B, H, S, D)" if layout == "bhsd" else "(B, S, H, D)")
    left, right = check_options(window_size, softcap, scale)
    top_left = check_alignment(causal_alignment)
    if layout == "bshd":
        qv, kv, vv = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    else:
        qv, kv, vv = q, k, v
    B, Hq, Sq, D = qv.shape
    Bk, Hkv, Sk, Dk = kv.shape
    Bv, Hv, Sv, Dv = vv.shape
    if Bk != B or Bv != B:
        _fail(f"k, v: batch sizes {Bk}, {Bv} differ from q's {B}")
    if Hv != Hkv:
        _fail(f"v: {Hv} heads, k has {Hkv}")
    if Sv != Sk:
        _fail(f"v: sequence length {Sv} differs from k's {Sk}")
    if Hkv == 0 or Hq % Hkv:
        _fail(f"q: {Hq} query heads is not a multiple of the {Hkv} KV heads of k/v")
    check_head_dims(D, Dk, Dv)
    mask, wl, wr = mask_kind(bool(causal), (left, right))
    spec, interpret = kernel_for("fwd", dtype, q.device, D, Dv, Hq // Hkv, mask, softcap, False)
    args = MaskArgs(scale=float(scale) if scale is not None else default_scale(D),
                    softcap=float(softcap), window_left=wl, window_right=wr, align_top_left=top_left)
    mod = loader.load(spec)
    cfg = dispatch.fwd_config(spec, dispatch.device_kind(q.device, interpret))
    if layout == "bshd":
        out = torch.empty((B, Sq, Hq, Dv), dtype=dtype, device=q.device)
        out_v = out.transpose(1, 2)
    else:
        out = out_v = torch.empty((B, Hq, Sq, Dv), dtype=dtype, device=q.device)
    lse = torch.empty((B, Hq, Sq), dtype=torch.float32, device=q.device)
    attn_fwd(mod, spec, qv, kv, vv, out_v, lse, args, cfg)
    return (out, lse) if return_lse else out
