"""Forward launcher for the `fwd` family (templates/attn_fwd.py.jinja)."""

from __future__ import annotations

from types import ModuleType

import torch
import triton

from attngen.kernels.common import MaskArgs, packed_strides
from attngen.spec import KernelSpec
from attngen.tuning.space import FwdConfig, next_pow2


def attn_fwd(mod: ModuleType, spec: KernelSpec, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             out: torch.Tensor, lse: torch.Tensor, mask: MaskArgs, cfg: FwdConfig) -> None:
    """Dense: q (B, Hq, Sq, D), k/v (B, Hkv, Sk, D), out (B, Hq, Sq, Dv), lse (B, Hq, Sq) fp32 --
    any strides (a bshd tensor is passed as its permuted view)."""
    B, Hq, Sq, _ = q.shape
    Sk = k.shape[2]
    if Sq == 0 or B == 0 or Hq == 0:
        return
    qk_scale, softcap_in, softcap_out = mask.score_args()
    grid = (triton.cdiv(Sq, cfg.block_m), B * Hq)
    mod._attn_fwd[grid](
        q, k, v, out, lse,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(), *lse.stride(),
        Hq, Sq, Sk,
        None, None,
        qk_scale, softcap_in, softcap_out,
        mask.diag_offset(Sq, Sk), mask.window_left, mask.window_right,
        ALIGN_TOP_LEFT=mask.align_top_left,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        PAD_QK=next_pow2(spec.head_dim_qk), PAD_V=next_pow2(spec.head_dim_v),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )


def attn_fwd_varlen(mod: ModuleType, spec: KernelSpec, q: torch.Tensor, k: torch.Tensor,
                    v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, cu_seqlens_q: torch.Tensor,
                    cu_seqlens_k: torch.Tensor, max_seqlen_q: int, mask: MaskArgs, cfg: FwdConfig) -> None:
    """Packed: q (Tq, Hq, D), k/v (Tk, Hkv, D), out (Tq, Hq, Dv), lse (Hq, Tq) fp32."""
    num_docs = cu_seqlens_q.numel() - 1
    Hq = q.shape[1]
    if num_docs == 0 or max_seqlen_q == 0 or q.shape[0] == 0:
        return
    qk_scale, softcap_in, softcap_out = mask.score_args()
    grid = (triton.cdiv(max_seqlen_q, cfg.block_m), num_docs * Hq)
    mod._attn_fwd[grid](
        q, k, v, out, lse,
        *packed_strides(q), *packed_strides(k), *packed_strides(v), *packed_strides(out),
        0, lse.stride(0), lse.stride(1),
        Hq, 0, 0,
        cu_seqlens_q, cu_seqlens_k,
        qk_scale, softcap_in, softcap_out,
        0, mask.window_left, mask.window_right,
        ALIGN_TOP_LEFT=mask.align_top_left,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        PAD_QK=next_pow2(spec.head_dim_qk), PAD_V=next_pow2(spec.head_dim_v),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
