"""`attngen.explain` (which kernel, config and bucket a call uses, and why) and `attngen.warmup`
(compile the configs of given shape buckets ahead of time, for servers)."""

from __future__ import annotations

import time

import torch

from attngen.configs import pointer_bwd_config
from attngen.devices import describe
from attngen.runtime import api, dispatch, fp8, public, validate


def _launched(launches) -> list[dict]:
    """Each launch of a plan as it runs: entry point, programs and the tile constexprs it got (a
    config the kernel cannot take falls back inside the launcher, so this can differ from the
    config the table or the database chose)."""
    rows = []
    for la in launches:
        vals = la.values
        tiles = {k.lower(): vals[k] for k in ("BLOCK_M", "BLOCK_N", "CONSUMERS", "KV_STAGES")
                 if k in vals}
        rows.append({"entry": la.fn.__name__, "programs": la.grid, **tiles,
                     "num_warps": la.num_warps, "num_stages": la.num_stages,
                     "offsets_64bit": bool(vals.get("OFFS_64", False))})
    return rows


def explain(q, k, v, *, causal=False, window_size=(-1, -1), softcap=0.0, scale=None, layout="bhsd",
            causal_alignment="bottom_right", deterministic=False, cu_seqlens_q=None,
            cu_seqlens_k=None, max_seqlen_q: int = 0, max_seqlen_k: int = 0, precision=None,
            rotate=True, mask_mod=None, score_mod=None, sinks=None, params=None) -> dict:
    """What attngen.attention(q, k, v, **same options) would run, without running it; with
    cu_seqlens_q / cu_seqlens_k (and max_seqlen_*) what attngen.attention_varlen would run;
    precision="fp8": the fp8 family's prologue and kernel (no backward)."""
    packed = cu_seqlens_q is not None or cu_seqlens_k is not None
    if packed:
        validate.check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
        layout = "packed"
    else:
        validate.check_dense(q, k, v, layout)
    opts = validate.make_options(q.shape[-1], causal, window_size, softcap, scale, causal_alignment, layout)
    if precision is not None and fp8.check_precision(precision, rotate):
        plan = fp8.Fp8Plan(q, k, v, opts, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           rotate=rotate, out_dtype=q.dtype)
        # q_in_kernel: the attention kernel quantizes (and rotates) Q itself, the prologue K and V only
        return {**_summary(plan, opts, layout), "precision": "fp8", "rotate": rotate,
                "q_in_kernel": plan.q_in_kernel, "backward": None}
    extra = None
    if mask_mod is not None or score_mod is not None or sinks is not None or params:
        from attngen.runtime import exprs

        hq = q.shape[1] if layout in ("bhsd", "packed") else q.shape[2]
        opts, extra, _ = exprs.expr_options(q, hq, opts, mask_mod, score_mod, sinks, params)
    plan = (api.checked_plan(q, k, v, opts, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, extra)
            if packed else api.forward_plan(q, k, v, opts, extra=extra))
    bwd_spec = plan.spec.replace(family=api.BWD.name)
    from attngen.runtime import loader

    bwd_mod = loader.load(bwd_spec)
    bwd_cfg, bwd_source = dispatch.select_config(bwd_spec, bwd_mod.KERNEL_HASH, plan.device_class,
                                                 plan.bucket, opts.window)
    if bwd_cfg.tma and api.host_bound(plan.bucket) and bwd_source != "forced":  # as BackwardPlan does
        bwd_cfg = pointer_bwd_config(bwd_cfg)
        bwd_source += " (pointer kernels: a host-bound shape)"
    return {
        **_summary(plan, opts, layout), "precision": dispatch.DTYPE_NAMES[q.dtype],
        # the decode family (a short query on a long KV): slices of the key axis per (batch row,
        # KV head) and keys per slice, from shapes only
        **({"splits": {"num_splits": plan.num_splits, "split_len": plan.split_len}}
           if plan.spec.family == "decode" else {}),
        "backward": {"kernel": bwd_spec.uri, "file": str(bwd_mod.__file__),
                     "config": bwd_cfg.as_dict(), "config_source": bwd_source,
                     "deterministic_dq": bool(deterministic or not bwd_cfg.atomic_dq)},
    }


def _summary(plan, opts, layout: str) -> dict:
    """What explain() says of any family's plan: kernel, config and where it came from, launches."""
    launched = _launched(plan.launches_spec)
    why = ("the tuning database's winner for this kernel, device class and bucket (or its nearest "
           "tuned bucket)" if plan.config_source.startswith("tuned") else
           "a dispatch.forced_config scope" if plan.config_source == "forced" else
           "the family's default table (nothing tuned for this kernel and device class)")
    tuned_in = None
    if plan.config_source.startswith("tuned"):
        from attngen.db import winners  # stdlib sqlite3 only

        found = winners.find(plan.spec.uri, plan.module.KERNEL_HASH, plan.device_class, plan.bucket)
        tuned_in = (f"{found[1]}: {found[2]}" + (f" ({found[3]} class)" if found[3] != plan.device_class else "")
                    if found else None)
    return {
        "kernel": plan.spec.uri, "file": str(plan.module.__file__), "device_class": plan.device_class,
        "device": describe(plan.device_class),
        "bucket": plan.bucket.key, "config": plan.config.as_dict(), "config_source": plan.config_source,
        "why": why, **({"tuned_in": tuned_in} if tuned_in else {}),
        # programs of the family's main kernel (the fp8 prologue's launches come first)
        "launches": launched,
        "programs": next((r["programs"] for r in launched if r["entry"] == plan.FAMILY.kernels[0]),
                         launched[0]["programs"] if launched else 0),
        "offsets_64bit": any(r["offsets_64bit"] for r in launched), "mask": opts.mask,
        "layout": layout, **_expressions(plan.spec),
    }


def _expressions(spec) -> dict:
    """An expression kernel's expressions as its identity holds them, and how its loops use the
    mask: key ranges from the mask's affine bounds, tiles tested one by one where an `or` or a
    condition leaves gaps (attngen.codegen.exprgen)."""
    if not spec.has_expr:
        return {}
    from attngen.codegen.exprranges import gathers_along, needs_tile_skip
    from attngen.spec.expr_terms import run_params
    from attngen.spec import expr as X

    node = X.parse(spec.mask_expr, "mask", {p.name: p for p in spec.params}) if spec.mask_expr else None
    text = None
    if node is not None:
        text = "key loop [lo, hi) from the mask's bounds over each query block; [full_lo, full_hi) runs without mask math"
        runs = run_params(node)
        if runs:
            text += (f"; {', '.join(runs)} compared along both indices (document ids): the ranges and full "
                     "tiles come from its runs of equal values where it never decreases (checked in the kernel "
                     "each call), else the whole range is masked")
        if needs_tile_skip(node, "kv_idx"):
            text += ("; the mask has gaps inside that range (an `or`, a condition, a parameter gathered along "
                     "kv_idx): the forward tests each masked tile and skips those it keeps nothing of (not the "
                     "warp-specialized loop)")
            gathered = [n for n in ("kv_idx", "q_idx") if gathers_along(node, n)]
            text += (f"; the backward's loops too (a parameter gathered along {' and '.join(gathered)})" if gathered
                     else "; the backward masks them")
    return {"expressions": {
        "mask": spec.mask_expr or None, "score_mod": spec.score_expr or None,
        "params": [p.text() for p in spec.params], "sinks": spec.sinks, "tile_classification": text,
    }}


def warmup(*, num_q_heads: int, num_kv_heads: int, head_dim: int, seqlens=(1024,), batch: int = 1,
           dtype=torch.bfloat16, device="cuda", causal=False, window_size=(-1, -1), softcap=0.0,
           layout="bhsd", backward=False, varlen=False) -> list[dict]:
    """Compile the kernels and configs that calls of these shape classes will use: one small call
    per sequence length (its bucket's config), forward and, with backward=True, backward. Lengths
    never recompile a kernel, so any later length in these buckets only builds a plan (no compile).
    varlen=True warms attention_varlen (`batch` documents of each length)."""
    if varlen:
        return _warmup_varlen(num_q_heads, num_kv_heads, head_dim, seqlens, batch, dtype, device,
                              dict(causal=causal, window_size=window_size, softcap=softcap), backward)
    rows = []
    for s in seqlens:
        shape_q = (batch, num_q_heads, s, head_dim)
        shape_k = (batch, num_kv_heads, s, head_dim)
        if layout == "bshd":
            shape_q, shape_k = (batch, s, num_q_heads, head_dim), (batch, s, num_kv_heads, head_dim)
        q = torch.randn(shape_q, dtype=dtype, device=device, requires_grad=backward)
        k = torch.randn(shape_k, dtype=dtype, device=device, requires_grad=backward)
        v = torch.randn(shape_k, dtype=dtype, device=device, requires_grad=backward)
        kw = dict(causal=causal, window_size=window_size, softcap=softcap, layout=layout)
        t0 = time.perf_counter()
        out = public.attention(q, k, v, **kw)
        if backward:
            out.sum().backward()
        if q.is_cuda:
            torch.cuda.synchronize(q.device)
        info = explain(q.detach(), k.detach(), v.detach(), **kw)
        rows.append({"seqlen": s, "bucket": info["bucket"], "kernel": info["kernel"],
                     "config": info["config"], "backward": backward,
                     "seconds": round(time.perf_counter() - t0, 3)})
    return rows


def _warmup_varlen(hq, hkv, d, seqlens, docs, dtype, device, kw, backward) -> list[dict]:
    rows = []
    for s in seqlens:
        t = docs * s
        q = torch.randn(t, hq, d, dtype=dtype, device=device, requires_grad=backward)
        k = torch.randn(t, hkv, d, dtype=dtype, device=device, requires_grad=backward)
        v = torch.randn(t, hkv, d, dtype=dtype, device=device, requires_grad=backward)
        cu = torch.arange(0, t + 1, s, dtype=torch.int32, device=device)
        t0 = time.perf_counter()
        out = public.attention_varlen(q, k, v, cu, cu, s, s, **kw)
        if backward:
            out.sum().backward()
        if q.is_cuda:
            torch.cuda.synchronize(q.device)
        opts = validate.make_options(d, kw["causal"], kw["window_size"], kw["softcap"], None,
                                "bottom_right", "packed")
        plan = api.forward_plan(q.detach(), k.detach(), v.detach(), opts, cu, cu, s, s)
        rows.append({"seqlen": s, "bucket": plan.bucket.key, "kernel": plan.spec.uri,
                     "config": plan.config.as_dict(), "backward": backward,
                     "seconds": round(time.perf_counter() - t0, 3)})
    return rows
