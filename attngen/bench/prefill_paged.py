"""`attngen bench --mode prefill-paged`: chunked prefill on a paged KV cache beside the dense varlen
prefill of the same shapes, TFLOP/s.

Every row is a batch of sequences, each a chunk of new queries at the end of its keys (the keys
before the chunk are the cached prefix), causal bottom-right, bf16. Measured in one process on the
same values:

* `attngen-paged`: attngen.attention_varlen with block_table and seqused_k, the keys in pages of
  PAGE tokens in shuffled order (the prefill_paged family's pointer gather: vLLM's page size);
* `attngen-paged64`: the same with pages of PAGE_TMA tokens, which hold whole key blocks (on
  sm90 K / V then come through the copy engine: families/prefill_paged.py, tma_kv);
* `attngen-varlen`: attngen.attention_varlen on the same keys packed densely, cu_seqlens_k (the
  forward family), the yardstick a paged kernel is held to.

Time: the median of triton.testing.do_bench; FLOPs: 4 x Hq x D x the exact number of attended
(query, key) pairs. Each provider's output is compared with the first one's before timing.
`run(..., device="cpu", timer=...)` runs the same plumbing in Triton's interpreter (the CPU test of
this mode).
"""

from __future__ import annotations

import json
import platform
import sys
from dataclasses import dataclass

import torch

from attngen.bench.run import BUSY_MS, TIMING, with_discarded_first
from attngen.problem import attended_pairs

PAGE = 16
PAGE_TMA = 64
PROVIDERS = ("attngen-paged", "attngen-paged64", "attngen-varlen")


@dataclass(frozen=True)
class PrefillCase:
    """`seqs` sequences of `chunk` new queries after `context - chunk` cached keys each; `decodes`
    more sequences of one query token at `context` keys (a mixed batch, as a scheduler builds it)."""

    seqs: int
    chunk: int
    context: int
    heads_q: int = 32
    heads_kv: int = 8
    head_dim: int = 128
    decodes: int = 0

    @property
    def name(self) -> str:
        heads = "mha" if self.heads_q == self.heads_kv else f"gqa{self.heads_q}/{self.heads_kv}"
        mixed = f"+{self.decodes}dec" if self.decodes else ""
        return f"{self.seqs}x{self.chunk}-ctx{self.context}{mixed}-{heads}-hd{self.head_dim}"

    @property
    def lens(self) -> tuple[list[int], list[int]]:
        """(queries, keys) per sequence."""
        return ([self.chunk] * self.seqs + [1] * self.decodes, [self.context] * (self.seqs + self.decodes))

    @property
    def flops(self) -> float:
        pairs = sum(attended_pairs(a, b, causal=True) for a, b in zip(*self.lens))
        return 4.0 * self.heads_q * self.head_dim * pairs


CASES = [PrefillCase(1, 8192, 8192), PrefillCase(4, 2048, 8192), PrefillCase(16, 512, 4096),
         PrefillCase(8, 512, 4096, decodes=56), PrefillCase(4, 2048, 16384), PrefillCase(2, 4096, 8192, 32, 32),
         PrefillCase(4, 2048, 8192, head_dim=64)]


def _providers(case: PrefillCase, dtype, device, seed: int = 0) -> dict:
    """name -> a callable returning the output (total_q, Hq, D), bound to one case's tensors."""
    import attngen

    g = torch.Generator(device=device).manual_seed(seed)
    lq, lk = case.lens
    hq, hkv, d = case.heads_q, case.heads_kv, case.head_dim
    q = torch.randn(sum(lq), hq, d, generator=g, device=device, dtype=dtype)
    k = torch.randn(sum(lk), hkv, d, generator=g, device=device, dtype=dtype)
    v = torch.randn(sum(lk), hkv, d, generator=g, device=device, dtype=dtype)
    cu_q = torch.tensor([0, *_cumulative(lq)], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, *_cumulative(lk)], dtype=torch.int32, device=device)
    used = torch.tensor(lk, dtype=torch.int32, device=device)
    mq, mk = max(lq), max(lk)

    def paged(page: int):
        per_seq = -(-max(lk) // page)
        perm = torch.randperm(len(lk) * per_seq, generator=torch.Generator().manual_seed(seed)).to(device)
        table = perm.reshape(len(lk), per_seq).to(torch.int32)
        pages = {}
        for name, x in (("k", k), ("v", v)):
            rows = torch.zeros(len(lk), per_seq * page, hkv, d, device=device, dtype=dtype)
            for b, (start, n) in enumerate(zip(cu_k.tolist(), lk)):
                rows[b, :n] = x[start:start + n]
            pooled = torch.empty(len(lk) * per_seq, page, hkv, d, device=device, dtype=dtype)
            pooled[perm] = rows.reshape(-1, page, hkv, d)
            pages[name] = pooled
        return lambda: attngen.attention_varlen(q, pages["k"], pages["v"], cu_q, None, mq, mk, causal=True,
                                                block_table=table, seqused_k=used)

    return {
        "attngen-paged": paged(PAGE),
        "attngen-paged64": paged(PAGE_TMA),
        "attngen-varlen": lambda: attngen.attention_varlen(q, k, v, cu_q, cu_k, mq, mk, causal=True),
    }


def _cumulative(lens):
    total, out = 0, []
    for n in lens:
        total += n
        out.append(total)
    return out


def _do_bench(fn, timing) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=timing["warmup_ms"], rep=timing["rep_ms"], return_mode="median"))


def run(cases, dtype=torch.bfloat16, quick: bool = False, providers=None, out: str | None = None,
        device="cuda", timer=None) -> dict:
    """Measure `cases`; with `out`, the results so far are written after every row. timer(fn) -> ms
    (default: do_bench's median); on a GPU the first case runs once unrecorded first."""
    import triton

    device = torch.device(device)
    cuda = device.type == "cuda"
    timing = TIMING["quick" if quick else "full"]
    timer = timer or (lambda fn: _do_bench(fn, timing))
    rows = []
    doc = {"gpu": torch.cuda.get_device_name(device) if cuda else "cpu (Triton's interpreter)",
           "torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
           "dtype": str(dtype).replace("torch.", ""), "page_size": PAGE, "page_size_paged64": PAGE_TMA,
           "timing": {**timing, "return_mode": "median", "function": "triton.testing.do_bench"},
           "flops": "4 x Hq x D x attended (query, key) pairs, causal bottom-right per sequence", "rows": rows}
    for case, keep in (with_discarded_first(cases) if cuda else [(c, True) for c in cases]):
        bound = _providers(case, dtype, device)
        names = [n for n in bound if providers is None or n in providers]
        lq, lk = case.lens
        row = {"case": case.name, "seqs": len(lq), "chunk": case.chunk, "context": case.context,
               "decodes": case.decodes, "Hq": case.heads_q, "Hkv": case.heads_kv, "D": case.head_dim,
               "flops": case.flops, "ms": {}, "TFLOPs": {}, "notes": {}}
        if cuda:
            from attngen.devices import busy_gpu

            busy_gpu(device)
        ref = None
        with torch.no_grad():
            for name in names:
                try:
                    o = bound[name]().float()
                    if cuda:
                        torch.cuda.synchronize()
                        busy_gpu(device, BUSY_MS)
                    if ref is None:
                        ref = o
                    elif (o - ref).abs().max().item() > 2e-2:
                        row["notes"][name] = f"output differs from {names[0]}'s by {(o - ref).abs().max().item():.3g}"
                    ms = timer(bound[name])
                except Exception as exc:  # a provider that cannot take the case: recorded, not fatal
                    row["notes"][name] = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                    continue
                row["ms"][name] = ms
                row["TFLOPs"][name] = round(case.flops / ms / 1e9, 2)
        for name in ("attngen-paged", "attngen-paged64"):
            if name in row["TFLOPs"] and "attngen-varlen" in row["TFLOPs"]:
                row[f"{name[8:]}/varlen"] = round(row["ms"]["attngen-varlen"] / row["ms"][name], 3)
        if not keep:
            continue
        rows.append(row)
        print(json.dumps({k: row.get(k) for k in ("case", "TFLOPs", "paged/varlen", "paged64/varlen", "notes")}),
              flush=True)
        if out:
            with open(out, "w") as f:
                json.dump(doc, f, indent=1)
    return doc


def _fail(msg: str, code: int) -> int:
    print(f"attngen bench --mode prefill-paged: {msg}", file=sys.stderr)
    return code


def main_args(args) -> int:
    """`attngen bench --mode prefill-paged [--cases ...] [--providers ...] [--out F] [--quick]`: exit 0
    done, 1 no GPU, 2 bad arguments."""
    from attngen.bench.cases import mode_selection

    if getattr(args, "from_json", None) or getattr(args, "plot", None):
        return _fail("--plot / --from: this mode writes JSON only (--out)", 2)
    chosen = mode_selection(args, CASES, PROVIDERS, "prefill-paged", _fail)
    if isinstance(chosen, int):
        return chosen
    cases, providers = chosen
    run(cases, quick=args.quick, providers=providers, out=args.out)
    if args.out:
        print(f"wrote {args.out}")
    return 0
