"""GPU: CUDA graphs around attention's backward as well as its forward — captured by hand
(torch.cuda.make_graphed_callables: forward and backward graphs), by torch.compile's
"reduce-overhead" mode (inductor's CUDA graphs), and for packed documents. Shapes are large enough
that the sm90 Gluon / TMA kernels serve (not the host-bound pointer path); each replay is compared
bit for bit with an eager call on the same inputs (deterministic backward)."""

from __future__ import annotations

import pytest
import torch

import attngen
from attngen.problem import random_inputs

pytestmark = pytest.mark.gpu
DEV = "cuda"
SHAPES = ((2, 8, 777, 128), (2, 2, 777, 128), (2, 2, 777, 128), (2, 8, 777, 128))


def _fn(q, k, v):
    return attngen.attention(q, k, v, causal=True, deterministic=True)


def _eager(q, k, v, dout):
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    out = _fn(*leaves)
    return out.detach(), torch.autograd.grad(out, leaves, dout)


def test_make_graphed_callables_forward_and_backward():
    q, k, v, dout = random_inputs(*SHAPES, dtype=torch.bfloat16, device=DEV, seed=11)
    sample = [t.clone().requires_grad_(True) for t in (q, k, v)]
    graphed = torch.cuda.make_graphed_callables(_fn, tuple(sample))
    for seed in (12, 13):
        q, k, v, dout = random_inputs(*SHAPES, dtype=torch.bfloat16, device=DEV, seed=seed)
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = graphed(*leaves)
        grads = torch.autograd.grad(out, leaves, dout)
        ref_out, ref_grads = _eager(q, k, v, dout)
        assert torch.equal(out.detach(), ref_out), "graphed forward differs from eager"
        for name, g, r in zip(("dq", "dk", "dv"), grads, ref_grads):
            assert torch.equal(g, r), f"graphed backward {name} differs from eager"
    if torch.cuda.get_device_capability()[0] == 9:  # the sm90 kernels serve this shape
        assert attngen.explain(q, k, v, causal=True)["launches"][0]["entry"] != "_attn_fwd"


def test_compile_reduce_overhead_forward_and_backward():
    compiled = torch.compile(_fn, mode="reduce-overhead", fullgraph=True)
    for seed in (21, 22, 23):  # the first calls record, later ones replay the CUDA graphs
        q, k, v, dout = random_inputs(*SHAPES, dtype=torch.bfloat16, device=DEV, seed=seed)
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = compiled(*leaves)
        grads = torch.autograd.grad(out, leaves, dout)
        ref_out, ref_grads = _eager(q, k, v, dout)
        assert torch.equal(out.detach(), ref_out), f"seed {seed}: compiled forward differs"
        for name, g, r in zip(("dq", "dk", "dv"), grads, ref_grads):
            assert torch.equal(g, r), f"seed {seed}: compiled backward {name} differs"


def test_cuda_graph_packed_documents():
    lens = [300, 1000, 57, 700]
    T, Hq, Hkv, D = sum(lens), 8, 2, 128
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=DEV)
    static = list(random_inputs((T, Hq, D), (T, Hkv, D), (T, Hkv, D), dtype=torch.bfloat16,
                                device=DEV, seed=31))

    def call(*t):
        return attngen.attention_varlen(*t, cu, cu, max(lens), max(lens), causal=True)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):  # warm: plans built, cu_seqlens checked once (a host copy)
            call(*static)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = call(*static)
    for seed in (32, 33):
        new = random_inputs((T, Hq, D), (T, Hkv, D), (T, Hkv, D), dtype=torch.bfloat16, device=DEV,
                            seed=seed)
        for dst, src in zip(static, new):
            dst.copy_(src)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, call(*new)), "replay differs from eager"
