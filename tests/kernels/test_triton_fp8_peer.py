"""The Triton fp8 speed peer (attngen.bench.triton_fp8_peer) against float64 attention on odd shapes:
RMSE under a fixed bound that the same kernel with the wrong mask exceeds; V = 1 gives rows that sum
to one (a key past S counted in the softmax sum shows); Q, K and V^T read through strided views, K's
and V^T's padding past S set to 0x7F (e4m3 NaN on a GPU, where a V value past S read into P.V makes the
output NaN; Triton 3.6's interpreter reads 0x7F as 480); the argument checks. Runs in Triton's
interpreter on CPU, or on a GPU when there is one."""

from __future__ import annotations

import math

import pytest
import torch

from attngen import env
from attngen.bench.triton_fp8_peer import make_call, per_tensor_e4m3, triton_fp8_attention
from attngen.problem import attention_ref, random_inputs

DEVICE = "cpu" if env.interpreting() or not torch.cuda.is_available() else "cuda"
E4M3 = torch.float8_e4m3fn
RMSE_BOUND = 0.03  # fp8 (one scale per tensor, P in e4m3) on these N(0, 1) inputs: 0.006-0.013
SMALL = {"block_m": 32, "block_n": 32, "num_warps": 4, "num_stages": 1}

# (B, H, S, D, causal, blocks)
CASES = [
    (1, 2, 113, 64, False, SMALL),
    (2, 2, 113, 64, True, SMALL),
    (1, 2, 203, 128, True, {**SMALL, "block_m": 64}),
    (2, 2, 203, 128, False, {**SMALL, "block_n": 64}),
    (1, 2, 203, 64, True, {**SMALL, "block_n": 64}),  # BLOCK_N > BLOCK_M: the band starts left of the block
]


def _cid(c):
    B, H, S, D, causal, blocks = c
    return f"b{B}_h{H}_s{S}_hd{D}{'_causal' if causal else ''}_m{blocks['block_m']}_n{blocks['block_n']}"


def _rmse(out, ref) -> float:
    return (out.double() - ref.double()).pow(2).mean().sqrt().item()


def _inputs(B, H, S, D, seed=0):
    return random_inputs(*[(B, H, S, D)] * 3, dtype=torch.bfloat16, device=DEVICE, seed=seed)


@pytest.mark.parametrize("case", CASES, ids=_cid)
def test_peer_against_float64(case):
    B, H, S, D, causal, blocks = case
    q, k, v = _inputs(B, H, S, D)
    ref, _ = attention_ref(q, k, v, causal=causal, top_left=True)
    out = make_call(q, k, v, causal, **blocks)()
    assert out.shape == (B, H, S, D) and out.dtype == torch.bfloat16, (out.shape, out.dtype)
    assert torch.isfinite(out).all(), f"{_cid(case)}: {int((~torch.isfinite(out)).sum())} non-finite values"
    err = _rmse(out, ref)
    assert err < RMSE_BOUND, f"{_cid(case)}: RMSE {err:.4f} vs float64 >= {RMSE_BOUND}"
    # the bound can fail: the same kernel with the other mask is far off
    wrong = _rmse(make_call(q, k, v, not causal, **blocks)(), ref)
    assert wrong > 2 * RMSE_BOUND, f"{_cid(case)}: the wrong mask gives RMSE {wrong:.4f}, the bound cannot fail"


@pytest.mark.parametrize("causal, S, blocks", [(False, 113, SMALL), (True, 113, SMALL),
                                               (False, 203, {**SMALL, "block_n": 64})])
def test_peer_rows_sum_to_one(causal, S, blocks):
    """V = 1: every output is the softmax row's sum, 1. A key past S (or right of the diagonal) that
    enters the row's sum l but not P.V shows as a shortfall that the RMSE test's N(0, 1) values hide."""
    q, k, _ = _inputs(1, 2, S, 64, seed=2)
    out = make_call(q * 0.5, k, torch.ones_like(q), causal, **blocks)()
    err = (out.double() - 1).abs().max().item()
    assert err < 0.05, f"causal={causal} S={S}: max |out - 1| = {err:.4f}"


def test_peer_strided_views_and_nan_padding():
    """Q in (B, S, H, D) memory, K and V^T slices of buffers padded past S with 0x7F (e4m3 NaN)."""
    B, H, S, D, pad = 2, 2, 113, 64, 15
    q, k, v = _inputs(B, H, S, D, seed=4)
    (q8, dq), (k8, dk), (v8, dv) = (per_tensor_e4m3(x) for x in (q, k, v))
    q_bshd = q8.transpose(1, 2).contiguous().transpose(1, 2)
    k_buf = torch.empty(B, H, S + pad, D, dtype=E4M3, device=DEVICE)
    k_buf.view(torch.uint8).fill_(0x7F)
    k_buf[:, :, :S] = k8
    vt_buf = torch.empty(B, H, D, S + pad, dtype=E4M3, device=DEVICE)
    vt_buf.view(torch.uint8).fill_(0x7F)
    vt_buf[..., :S] = v8.transpose(-1, -2)
    sm_scale = dq * dk / math.sqrt(D)
    for causal in (False, True):
        out = triton_fp8_attention(q_bshd, k_buf[:, :, :S], vt_buf[..., :S], causal, sm_scale, v_scale=dv, **SMALL)
        assert torch.isfinite(out).all(), f"causal={causal}: {int((~torch.isfinite(out)).sum())} non-finite values"
        ref, _ = attention_ref(q, k, v, causal=causal, top_left=True)
        err = _rmse(out, ref)
        assert err < RMSE_BOUND, f"causal={causal}: RMSE {err:.4f} vs float64 >= {RMSE_BOUND}"


def test_peer_argument_errors():
    q8 = torch.zeros(1, 2, 40, 64, dtype=E4M3, device=DEVICE)
    vt8 = torch.zeros(1, 2, 64, 40, dtype=E4M3, device=DEVICE)
    with pytest.raises(ValueError, match="q8 must be float8_e4m3fn"):
        triton_fp8_attention(q8.bfloat16(), q8, vt8, False, 0.1)
    with pytest.raises(ValueError, match="k8 must have q8's shape"):
        triton_fp8_attention(q8, q8[:, :, :39], vt8, False, 0.1)
    with pytest.raises(ValueError, match="vt8 must be V transposed"):
        triton_fp8_attention(q8, q8, q8, False, 0.1)
    with pytest.raises(ValueError, match="vt8 must have 4 dimensions"):
        triton_fp8_attention(q8, q8, vt8[0], False, 0.1)
    with pytest.raises(ValueError, match="head dim must be a power of two"):
        triton_fp8_attention(q8[..., :48], q8[..., :48], vt8[:, :, :48], False, 0.1)
    with pytest.raises(ValueError, match="block_n must be a power of two"):
        triton_fp8_attention(q8, q8, vt8, False, 0.1, block_n=48)
