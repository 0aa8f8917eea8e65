"""A plain Triton fp8 FlashAttention forward: the speed peer of `attngen bench --mode fp8`.

It answers "what does a straightforward Triton fp8 kernel reach?" beside attngen's own fp8 kernels, in
the manner of the fp8 mode of Triton's fused-attention tutorial: Q, K and V^T in e4m3 with no
quantization scales inside the kernel (no block descales, no rotation, no scaling of P before its
e4m3 rounding), online softmax in fp32 with exp2, P rounded to e4m3 for the P.V dot, a bf16 output.
Its accuracy is whatever one per-tensor scale gives; it is a speed reference only, never a kernel
attngen serves.

- `_attn_fwd`: one program per (BLOCK_M queries, batch x head). Q, K (B, H, S, D) and V^T (B, H, D, S)
  in e4m3, any strides: V is transposed so that the P.V dot's reduction dimension (keys) is the
  contiguous one, the k-major operand Hopper's fp8 dot needs. Causal masks are top-left aligned
  (Sq = Sk); S need not be a multiple of the blocks.
- `triton_fp8_attention(q8, k8, vt8, causal, sm_scale, ...)`: checks its arguments, allocates the bf16
  output and launches. `v_scale` multiplies the output in the kernel's epilogue (V's descale).
- `make_call(q, k, v, causal)`: bf16 (B, H, S, D) tensors quantized once with one scale per tensor
  (x / (amax / 448)); the returned zero-argument callable runs the kernel alone, the part a benchmark
  times. Q's and K's descales fold into sm_scale, V's is `v_scale`.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
LOG2E = 1.4426950408889634


@triton.jit
def _attn_fwd_inner(acc, l_i, m_i, q, k_base, vt_base, stride_kn, stride_kk, stride_vk, stride_vn,
                    offs_m, offs_n, offs_d, lo, hi, seqlen, qk_scale,
                    BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    """Key blocks [lo, hi): unmasked (off-band) or, MASKED, with the key bound and the causal mask."""
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        k_ptrs = k_base + cols[:, None] * stride_kn + offs_d[None, :] * stride_kk  # (BLOCK_N, D)
        vt_ptrs = vt_base + offs_d[:, None] * stride_vk + cols[None, :] * stride_vn  # (D, BLOCK_N)
        if MASKED:
            k = tl.load(k_ptrs, mask=cols[:, None] < seqlen, other=0.0)
            vt = tl.load(vt_ptrs, mask=cols[None, :] < seqlen, other=0.0)
        else:
            k = tl.load(k_ptrs)
            vt = tl.load(vt_ptrs)
        qk = tl.dot(q, tl.trans(k)) * qk_scale  # log2 units: sm_scale * log2(e) in one multiply
        if MASKED:
            keep = cols[None, :] < seqlen
            if CAUSAL:
                keep = keep & (offs_m[:, None] >= cols[None, :])
            qk = tl.where(keep, qk, float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_ij[:, None])
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(tl.float8e4nv), tl.trans(vt), acc)
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit
def _attn_fwd(Q, K, Vt, O, qk_scale, v_scale, seqlen, H,
              stride_qz, stride_qh, stride_qm, stride_qk,
              stride_kz, stride_kh, stride_kn, stride_kk,
              stride_vz, stride_vh, stride_vk, stride_vn,
              stride_oz, stride_oh, stride_om, stride_ok,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    off_z = (off_hz // H).to(tl.int64)
    off_h = (off_hz % H).to(tl.int64)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    k_base = K + off_z * stride_kz + off_h * stride_kh
    vt_base = Vt + off_z * stride_vz + off_h * stride_vh
    q_ptrs = Q + off_z * stride_qz + off_h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qk
    q = tl.load(q_ptrs, mask=offs_m[:, None] < seqlen, other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    if CAUSAL:
        # off-band: whole key blocks left of the block's first query; on-band: the diagonal blocks
        band = (start_m * BLOCK_M) // BLOCK_N * BLOCK_N
        acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_base, vt_base, stride_kn, stride_kk, stride_vk,
                                        stride_vn, offs_m, offs_n, offs_d, 0, band, seqlen, qk_scale,
                                        BLOCK_N, False, True)
        hi = tl.minimum((start_m + 1) * BLOCK_M, seqlen)
        acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_base, vt_base, stride_kn, stride_kk, stride_vk,
                                        stride_vn, offs_m, offs_n, offs_d, band, hi, seqlen, qk_scale,
                                        BLOCK_N, True, True)
    else:
        # whole key blocks unmasked, then the partial last block (if any) with the key bound
        full = seqlen // BLOCK_N * BLOCK_N
        acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_base, vt_base, stride_kn, stride_kk, stride_vk,
                                        stride_vn, offs_m, offs_n, offs_d, 0, full, seqlen, qk_scale,
                                        BLOCK_N, False, False)
        acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_base, vt_base, stride_kn, stride_kk, stride_vk,
                                        stride_vn, offs_m, offs_n, offs_d, full, seqlen, seqlen, qk_scale,
                                        BLOCK_N, True, False)
    out = acc * (v_scale / l_i)[:, None]
    o_ptrs = O + off_z * stride_oz + off_h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_ok
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=offs_m[:, None] < seqlen)


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def triton_fp8_attention(q8: torch.Tensor, k8: torch.Tensor, vt8: torch.Tensor, causal: bool, sm_scale: float,
                         block_m: int = 128, block_n: int = 128, num_warps: int = 8, num_stages: int = 3, *,
                         v_scale: float = 1.0) -> torch.Tensor:
    """softmax(sm_scale * Q.K^T [causal, top-left]) . V * v_scale as a new bf16 (B, H, S, D) tensor.

    q8, k8: (B, H, S, D) e4m3; vt8: (B, H, D, S) e4m3 (V transposed; keys contiguous is the fast
    layout); any strides. D and the blocks are powers of two (D >= 16, blocks >= 16)."""
    for name, t in (("q8", q8), ("k8", k8), ("vt8", vt8)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != E4M3:
            raise ValueError(f"{name} must be float8_e4m3fn, got {t.dtype}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have 4 dimensions (B, H, ., .), got shape {tuple(t.shape)}")
        if t.device != q8.device:
            raise ValueError(f"{name} is on {t.device}, q8 on {q8.device}")
    B, H, S, D = q8.shape
    if tuple(k8.shape) != (B, H, S, D):
        raise ValueError(f"k8 must have q8's shape (B, H, S, D) = {(B, H, S, D)}, got {tuple(k8.shape)}")
    if tuple(vt8.shape) != (B, H, D, S):
        raise ValueError(f"vt8 must be V transposed, (B, H, D, S) = {(B, H, D, S)}, got {tuple(vt8.shape)}")
    if not (_pow2(D) and D >= 16):
        raise ValueError(f"q8's head dim must be a power of two >= 16, got {D}")
    for name, n in (("block_m", block_m), ("block_n", block_n)):
        if not (_pow2(n) and n >= 16):
            raise ValueError(f"{name} must be a power of two >= 16, got {n}")
    out = torch.empty((B, H, S, D), dtype=torch.bfloat16, device=q8.device)
    if out.numel() == 0:
        return out
    grid = (triton.cdiv(S, block_m), B * H)
    _attn_fwd[grid](q8, k8, vt8, out, float(sm_scale) * LOG2E, float(v_scale), S, H,
                    *q8.stride(), *k8.stride(), *vt8.stride(), *out.stride(),
                    HEAD_DIM=D, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=bool(causal),
                    num_warps=num_warps, num_stages=num_stages)
    return out


def per_tensor_e4m3(x: torch.Tensor) -> tuple[torch.Tensor, float]:
    """(x / d in e4m3, d) with d = amax(|x|) / 448, one scale for the whole tensor (1 for all zeros)."""
    amax = x.float().abs().amax().item()
    d = amax / E4M3_MAX if amax > 0 else 1.0
    return (x.float() / d).to(E4M3), d


def make_call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, **launch):
    """The benchmark's provider: bf16 (B, H, S, D) q, k, v quantized here, once; returns a
    zero-argument callable that runs the kernel alone and returns its bf16 output, attention of q, k, v
    with scale 1/sqrt(D). `launch`: triton_fp8_attention's block_m, block_n, num_warps, num_stages."""
    (q8, dq), (k8, dk), (v8, dv) = (per_tensor_e4m3(x) for x in (q, k, v))
    vt8 = v8.transpose(-1, -2).contiguous()
    sm_scale = dq * dk / math.sqrt(q.shape[-1])

    def run() -> torch.Tensor:
        return triton_fp8_attention(q8, k8, vt8, causal, sm_scale, v_scale=dv, **launch)
    return run
