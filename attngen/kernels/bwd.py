"""Backward launchers for the `bwd` family (templates/attn_bwd.py.jinja)."""

from __future__ import annotations

from types import ModuleType

import torch
import triton

from attngen.kernels.common import MaskArgs
from attngen.kernels.common import packed_strides as _packed
from attngen.spec import KernelSpec
from attngen.tuning.space import BwdConfig, next_pow2


def _pads(spec: KernelSpec) -> dict:
    return dict(PAD_QK=next_pow2(spec.head_dim_qk), PAD_V=next_pow2(spec.head_dim_v))


def attn_bwd(mod: ModuleType, spec: KernelSpec, q, k, v, out, dout, lse, dq, dk, dv,
             mask: MaskArgs, cfg: BwdConfig, deterministic: bool) -> None:
    """Dense (B, H, S, D) views, any strides; lse (B, Hq, Sq) fp32 contiguous. Writes dq, dk, dv.
    dQ comes from atomics only when cfg.atomic_dq and not `deterministic`."""
    B, Hq, Sq, _ = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    if B == 0 or Hq == 0:
        return
    if Sk == 0 or Sq == 0:
        dq.zero_(), dk.zero_(), dv.zero_()
        return
    delta = torch.empty_like(lse)
    mod._attn_bwd_preprocess[(triton.cdiv(Sq, cfg.dq_block_m), B * Hq)](
        out, dout, delta, *out.stride(), *dout.stride(), *delta.stride(),
        Hq, Sq, None, BLOCK_M=cfg.dq_block_m, PAD_V=next_pow2(spec.head_dim_v))
    qk_scale, softcap_in, softcap_out = mask.score_args()
    diag = mask.diag_offset(Sq, Sk)
    atomic = cfg.atomic_dq and not deterministic
    dq_acc = torch.zeros(dq.shape, dtype=torch.float32, device=dq.device) if atomic else dq
    mod._attn_bwd_dkdv[(triton.cdiv(Sk, cfg.block_n), B * Hkv)](
        q, k, v, dout, dq_acc, dk, dv, lse, delta,
        *q.stride(), *k.stride(), *v.stride(), *dout.stride(), *dq_acc.stride(), *dk.stride(),
        *dv.stride(), *lse.stride(),
        Hkv, Sq, Sk, None, None,
        qk_scale, mask.scale, softcap_in, softcap_out,
        diag, mask.window_left, mask.window_right,
        ALIGN_TOP_LEFT=mask.align_top_left, ATOMIC_DQ=atomic,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, **_pads(spec),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if not atomic:
        mod._attn_bwd_dq[(triton.cdiv(Sq, cfg.dq_block_m), B * Hq)](
            q, k, v, dout, dq, lse, delta,
            *q.stride(), *k.stride(), *v.stride(), *dout.stride(), *dq.stride(), *lse.stride(),
            Hq, Sq, Sk, None, None,
            qk_scale, mask.scale, softcap_in, softcap_out,
            diag, mask.window_left, mask.window_right,
            ALIGN_TOP_LEFT=mask.align_top_left,
            BLOCK_M=cfg.dq_block_m, BLOCK_N=cfg.dq_block_n, **_pads(spec),
            num_warps=cfg.dq_num_warps, num_stages=cfg.dq_num_stages)
    else:
        dq.copy_(dq_acc)


def attn_bwd_varlen(mod: ModuleType, spec: KernelSpec, q, k, v, out, dout, lse, dq, dk, dv,
                    cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int,
                    mask: MaskArgs, cfg: BwdConfig, deterministic: bool) -> None:
    """Packed q (Tq, Hq, D), k/v (Tk, Hkv, D); lse (Hq, Tq) fp32. dQ path as attn_bwd."""
    num_docs = cu_seqlens_q.numel() - 1
    Hq, Hkv = q.shape[1], k.shape[1]
    if num_docs == 0 or q.shape[0] == 0 or k.shape[0] == 0:
        dq.zero_(), dk.zero_(), dv.zero_()
        return
    delta = torch.empty_like(lse)
    lse_strides = (0, lse.stride(0), lse.stride(1))
    mod._attn_bwd_preprocess[(triton.cdiv(max(max_seqlen_q, 1), cfg.dq_block_m), num_docs * Hq)](
        out, dout, delta, *_packed(out), *_packed(dout), *lse_strides,
        Hq, 0, cu_seqlens_q, BLOCK_M=cfg.dq_block_m, PAD_V=next_pow2(spec.head_dim_v))
    qk_scale, softcap_in, softcap_out = mask.score_args()
    atomic = cfg.atomic_dq and not deterministic
    dq_acc = torch.zeros(dq.shape, dtype=torch.float32, device=dq.device) if atomic else dq
    mod._attn_bwd_dkdv[(triton.cdiv(max(max_seqlen_k, 1), cfg.block_n), num_docs * Hkv)](
        q, k, v, dout, dq_acc, dk, dv, lse, delta,
        *_packed(q), *_packed(k), *_packed(v), *_packed(dout), *_packed(dq_acc), *_packed(dk),
        *_packed(dv), *lse_strides,
        Hkv, 0, 0, cu_seqlens_q, cu_seqlens_k,
        qk_scale, mask.scale, softcap_in, softcap_out,
        0, mask.window_left, mask.window_right,
        ALIGN_TOP_LEFT=mask.align_top_left, ATOMIC_DQ=atomic,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, **_pads(spec),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if not atomic:
        mod._attn_bwd_dq[(triton.cdiv(max(max_seqlen_q, 1), cfg.dq_block_m), num_docs * Hq)](
            q, k, v, dout, dq, lse, delta,
            *_packed(q), *_packed(k), *_packed(v), *_packed(dout), *_packed(dq), *lse_strides,
            Hq, 0, 0, cu_seqlens_q, cu_seqlens_k,
            qk_scale, mask.scale, softcap_in, softcap_out,
            0, mask.window_left, mask.window_right,
            ALIGN_TOP_LEFT=mask.align_top_left,
            BLOCK_M=cfg.dq_block_m, BLOCK_N=cfg.dq_block_n, **_pads(spec),
            num_warps=cfg.dq_num_warps, num_stages=cfg.dq_num_stages)
    else:
        dq.copy_(dq_acc)
