"""`attngen bench --mode decode`: one query token on a KV cache, bytes of K and V read per second.

Every row measures, in one process on the same tensors, attngen.attention_with_kvcache on a
contiguous cache and on a paged one (page 16, shuffled pages), SDPA's FLASH_ATTENTION, CUDNN and
EFFICIENT_ATTENTION backends (q (B, Hq, 1, D), k / v (B, Hkv, S, D), enable_gqa) and compiled
FlexAttention (its decoding kernel serves a one-token query), and the device's copy bandwidth
(a 2 GiB device-to-device copy, read + write bytes, as the anchors count it). Time is the median
of triton.testing.do_bench; GB/s = 2 x B x S x Hkv x D x element size / time (K and V once, what
any kernel must read). Each provider's output is checked against attngen's before timing.
"""

from __future__ import annotations

import json
import platform
import sys
from dataclasses import dataclass

import torch

from attngen.bench.run import BUSY_MS, TIMING, with_discarded_first
from attngen.devices import busy_gpu

PAGE = 16


@dataclass(frozen=True)
class DecodeCase:
    batch: int
    seqlen_k: int
    heads_q: int
    heads_kv: int
    head_dim: int = 128

    @property
    def name(self) -> str:
        heads = "mha" if self.heads_q == self.heads_kv else f"gqa{self.heads_q}/{self.heads_kv}"
        return f"b{self.batch}-kv{self.seqlen_k // 1024}k-{heads}-hd{self.head_dim}"

    @property
    def kv_bytes(self) -> int:
        return 2 * self.batch * self.seqlen_k * self.heads_kv * self.head_dim * 2


CASES = [DecodeCase(b, s, 32, 8) for b, s in ((1, 4096), (1, 32768), (1, 131072), (8, 32768), (16, 16384),
                                             (32, 8192), (64, 4096), (64, 16384))]
CASES += [DecodeCase(1, 32768, 32, 32), DecodeCase(8, 8192, 32, 32), DecodeCase(8, 32768, 32, 8, 64)]


def _copy_tbps(device) -> float:
    from triton.testing import do_bench

    src = torch.empty(1 << 30, dtype=torch.int16, device=device)
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    return 2 * src.numel() * 2 / ms / 1e9


def _providers(case: DecodeCase, dtype, device, seed: int = 0):
    """name -> (callable, output (B, Hq, D)) bound to one case's tensors."""
    import attngen
    from torch.nn.attention import SDPBackend, sdpa_kernel

    g = torch.Generator(device=device).manual_seed(seed)
    B, S, hq, hkv, d = case.batch, case.seqlen_k, case.heads_q, case.heads_kv, case.head_dim
    q = torch.randn(B, 1, hq, d, generator=g, device=device, dtype=dtype)
    k = torch.randn(B, S, hkv, d, generator=g, device=device, dtype=dtype)
    v = torch.randn(B, S, hkv, d, generator=g, device=device, dtype=dtype)
    lens = torch.full((B,), S, dtype=torch.int32, device=device)
    npages = S // PAGE
    perm = torch.randperm(B * npages, generator=torch.Generator().manual_seed(seed)).to(device)
    table = perm.reshape(B, npages).to(torch.int32)
    kp = torch.empty(B * npages, PAGE, hkv, d, device=device, dtype=dtype)
    vp = torch.empty_like(kp)
    kp[perm] = k.reshape(B * npages, PAGE, hkv, d)
    vp[perm] = v.reshape(B * npages, PAGE, hkv, d)
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, S, D) views
    kc, vc = kt.contiguous(), vt.contiguous()
    out = {}
    out["attngen"] = lambda: attngen.attention_with_kvcache(q, k, v, lens)[:, 0]
    out["attngen-paged"] = lambda: attngen.attention_with_kvcache(q, kp, vp, lens, block_table=table)[:, 0]
    # an fp8 cache (one descale per (batch, KV head)): half the bytes
    kd, vd = (x.float().abs().amax(dim=(1, 3)) / 448.0 for x in (k, v))
    k8, v8 = ((x.float() / d[:, None, :, None]).to(torch.float8_e4m3fn) for x, d in ((k, kd), (v, vd)))
    out["attngen-fp8kv"] = lambda: attngen.attention_with_kvcache(q, k8, v8, lens, k_descale=kd, v_descale=vd)[:, 0]

    def sdpa(backend):
        def run():
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(qt, kc, vc, enable_gqa=hq != hkv)[:, :, 0]
        return run

    out["sdpa-flash"] = sdpa(SDPBackend.FLASH_ATTENTION)
    out["sdpa-cudnn"] = sdpa(SDPBackend.CUDNN_ATTENTION)
    out["sdpa-efficient"] = sdpa(SDPBackend.EFFICIENT_ATTENTION)
    from torch.nn.attention.flex_attention import flex_attention

    from attngen.bench.providers import configure_dynamo

    # a fresh compile per row, and an error rather than a silent fallback to eager FlexAttention
    # (which materializes the scores: rows measured that way read 0.1 TB/s, once the rows before
    # them had used up dynamo's recompile limit)
    torch._dynamo.reset()
    configure_dynamo()
    flex = torch.compile(flex_attention, dynamic=False)
    out["flex"] = lambda: flex(qt, kc, vc, enable_gqa=hq != hkv)[:, :, 0]
    return out


def run(cases, dtype=torch.bfloat16, quick: bool = False, providers=None, out: str | None = None) -> dict:
    """Measure `cases`; with `out`, the results so far are written after every row (a run cut
    short keeps what it had)."""
    import triton
    from triton.testing import do_bench

    device = torch.device("cuda")
    timing = TIMING["quick" if quick else "full"]
    copy = _copy_tbps(device)
    rows = []
    doc = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "python": platform.python_version(), "dtype": str(dtype).replace("torch.", ""),
           "copy_TBps": round(copy, 3), "page_size": PAGE,
           "timing": {**timing, "return_mode": "median", "function": "triton.testing.do_bench"},
           "first_case": "run once unrecorded before the rows (the first case timed in a process read low)",
           "bytes": "K and V of the cache once: 2 x B x S x Hkv x D x 2 bytes (attngen-fp8kv: x 1 byte)",
           "rows": rows}
    for case, keep in with_discarded_first(cases):
        bound = _providers(case, dtype, device)
        names = [n for n in bound if providers is None or n in providers]
        row = {"case": case.name, "B": case.batch, "S": case.seqlen_k, "Hq": case.heads_q, "Hkv": case.heads_kv,
               "D": case.head_dim, "kv_bytes": case.kv_bytes, "us": {}, "GBps": {}, "of_copy": {}, "notes": {}}
        busy_gpu(device)
        ref = None
        with torch.no_grad():
            for name in names:
                try:
                    o = bound[name]().float()
                    torch.cuda.synchronize()
                    if ref is None:
                        ref = o
                    elif (o - ref).abs().max().item() > (0.25 if name.endswith("fp8kv") else 2e-2):
                        row["notes"][name] = f"output differs from attngen's by {(o - ref).abs().max().item():.3g}"
                    busy_gpu(device, BUSY_MS)  # its clocks back up after the first (compiling) call
                    ms = do_bench(bound[name], warmup=timing["warmup_ms"], rep=timing["rep_ms"], return_mode="median")
                except Exception as exc:  # a backend that cannot take the case: recorded, not fatal
                    row["notes"][name] = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                    continue
                gbps = case.kv_bytes / BYTES_PER_VALUE.get(name, 1) / ms / 1e6
                row["us"][name] = round(ms * 1e3, 2)
                row["GBps"][name] = round(gbps, 1)
                row["of_copy"][name] = round(gbps / (copy * 1e3), 3)
        peers = [n for n in row["GBps"] if n.startswith(("sdpa", "flex"))]
        if "attngen" in row["GBps"] and peers:
            best = max(peers, key=lambda n: row["GBps"][n])
            row["best_peer"] = best
            row["attngen/best_peer"] = round(row["GBps"]["attngen"] / row["GBps"][best], 3)
        if "attngen" in row["GBps"] and "attngen-paged" in row["GBps"]:
            row["paged/contiguous"] = round(row["GBps"]["attngen-paged"] / row["GBps"]["attngen"], 3)
        if not keep:  # the discarded first pass
            continue
        rows.append(row)
        print(json.dumps({k: row[k] for k in ("case", "GBps", "of_copy", "notes")}), flush=True)
        if out:
            with open(out, "w") as f:
                json.dump(doc, f, indent=1)
    return doc


PROVIDERS = ("attngen", "attngen-paged", "attngen-fp8kv", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "flex")
BYTES_PER_VALUE = {"attngen-fp8kv": 2}  # divides kv_bytes (2 bytes a value): the bytes a provider reads


def _fail(msg: str, code: int) -> int:
    print(f"attngen bench --mode decode: {msg}", file=sys.stderr)
    return code


def main_args(args) -> int:
    """`attngen bench --mode decode [--cases ...] [--providers ...] [--out F] [--plot F.png]
    [--from F] [--quick]`: exit 0 done, 1 no GPU (or no matplotlib for --plot), 2 bad arguments."""
    if getattr(args, "from_json", None):
        if not args.plot:
            return _fail("--from only redraws a results file: give --plot FILE.png too", 2)
        with open(args.from_json) as f:
            return _plot(json.load(f), args.plot)
    from attngen.bench.cases import mode_selection

    chosen = mode_selection(args, CASES, PROVIDERS, "decode", _fail)
    if isinstance(chosen, int):
        return chosen
    cases, providers = chosen
    res = run(cases, quick=args.quick, providers=providers, out=args.out)
    if args.out:
        print(f"wrote {args.out}")
    return _plot(res, args.plot) if getattr(args, "plot", None) else 0


def _plot(doc: dict, path: str) -> int:
    """Grouped GB/s bars per case and provider, the copy bandwidth as a line."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return _fail("--plot needs matplotlib: pip install 'attngen[plot]'", 1)
    rows = doc["rows"]
    names = [n for n in PROVIDERS if any(n in r["GBps"] for r in rows)]
    fig, ax = plt.subplots(figsize=(max(8, 1.1 * len(rows)), 4.5))
    width = 0.8 / max(len(names), 1)
    for i, n in enumerate(names):
        xs = [j + i * width for j in range(len(rows))]
        ax.bar(xs, [r["GBps"].get(n, 0) / 1e3 for r in rows], width, label=n)
    ax.axhline(doc["copy_TBps"], color="k", linestyle="--", linewidth=1,
               label=f"copy bandwidth {doc['copy_TBps']:.2f} TB/s")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))], [r["case"] for r in rows], rotation=30,
                  ha="right", fontsize=8)
    ax.set_ylabel("K and V read, TB/s")
    ax.set_title(f"decode, one query token, {doc['dtype']}, {doc['gpu']}")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")
    return 0
