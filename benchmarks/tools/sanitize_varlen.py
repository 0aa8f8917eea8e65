"""The 20,000-document packed case of tests/gpu/test_gpu_edges.py (TMA forward, Gluon backward),
cold plans then a warm (raw-launcher) call, for compute-sanitizer memcheck
(benchmarks/results/h200_sanitizer_varlen20000_2026-12-04.log):
PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck python3 benchmarks/tools/sanitize_varlen.py [DOCS]"""
import sys
import torch
import attngen
from attngen.runtime import api

docs, L, H, D = int(sys.argv[1]) if len(sys.argv) > 1 else 20000, 64, 8, 128
dev = torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(20)
q, k, v, do = (torch.randn(docs * L, H, D, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(4))
cu = torch.arange(0, docs * L + 1, L, dtype=torch.int32, device=dev)
api.clear_plans()
for it in range(2):
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out, lse = attngen.attention_varlen(*leaves, cu, cu, L, L, causal=True, return_lse=True)
    grads = torch.autograd.grad(out, leaves, do)
    torch.cuda.synchronize()
    print(it, "finite:", all(bool(torch.isfinite(t).all()) for t in (out, *grads)), flush=True)
print(attngen.explain(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=L, max_seqlen_k=L, causal=True)["launches"])
