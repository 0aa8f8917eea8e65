"""Forward launcher of the `fwd` family (templates/attn_fwd.py.jinja)."""

from __future__ import annotations

from types import ModuleType

import triton

from attngen.kernels.common import MaskArgs
from attngen.kernels.launch import (Launch, descriptor_view, has_entry, host_part, lse_strides, needs_int64,
                                   programs, sm_count, strides4, tile_names, tma_descriptors)
from attngen.spec import KernelSpec
from attngen.configs import (WS_CONSUMER_REGS, FwdConfig, check_fwd, persistent_docs_ok,
                             pointer_fwd_config, require_valid, triton_fallback, ws_fwd_maxnreg)


def fwd_launches(mod: ModuleType, spec: KernelSpec, q, k, v, out, lse, mask: MaskArgs, cfg: FwdConfig,
                 cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q: int = 0,
                 gluon: bool | None = None) -> list[Launch]:
    """Dense: q (B, Hq, Sq, D), k/v (B, Hkv, Sk, D), out (B, Hq, Sq, Dv), lse (B, Hq, Sq) fp32, any
    strides (a bshd tensor is passed as its permuted view). Packed (cu_seqlens given): q (Tq, Hq, D),
    k/v (Tk, Hkv, D), out (Tq, Hq, Dv), lse (Hq, Tq). gluon: whether a Gluon kernel may serve
    (None: on a GPU only; Triton's interpreter does not run Gluon; the compile probe says True).
    Every config a launch runs -- `cfg`, or the fallback the Triton or pointer kernel takes when the
    Gluon or TMA kernel cannot serve the call -- passes check_fwd (configs.require_valid)."""
    require_valid(spec, cfg, check_fwd)
    packed = cu_seqlens_q is not None
    if packed:
        Hq = q.shape[1]
        bh, seqlen_q, seqlen_k = (cu_seqlens_q.numel() - 1) * Hq, 0, 0
        rows = max_seqlen_q if q.shape[0] else 0
    else:
        B, Hq, seqlen_q, _ = q.shape
        seqlen_k = k.shape[2]
        bh, rows = B * Hq, seqlen_q
    blocks = triton.cdiv(rows, cfg.block_m)
    qk_scale, softcap_in, softcap_out = mask.score_args()
    values = {
        "Q": q, "K": k, "V": v, "Out": out, "Lse": lse,
        "cu_seqlens_q": cu_seqlens_q, "cu_seqlens_k": cu_seqlens_k,
        **strides4("q", q, packed), **strides4("k", k, packed), **strides4("v", v, packed),
        **strides4("o", out, packed), **lse_strides(lse, packed),
        "num_q_heads": Hq, "seqlen_q": seqlen_q, "seqlen_k": seqlen_k, "num_m_blocks": blocks,
        "qk_scale": qk_scale, "softcap_in": softcap_in, "softcap_out": softcap_out,
        "diag_offset": 0 if packed else mask.diag_offset(seqlen_q, seqlen_k),
        "window_left": mask.window_left, "window_right": mask.window_right,
        "ALIGN_TOP_LEFT": mask.align_top_left, "OFFS_64": needs_int64(q, k, v, out, lse),
        "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "LAZY_RESCALE": bool(cfg.lazy_rescale),
        "GQA": spec.gqa_ratio,
    }
    # the Gluon kernel needs the GPU (Triton's interpreter does not run Gluon)
    use_ws = (bool(cfg.consumers) and has_entry(mod, "_attn_fwd_ws") and getattr(cfg, "tma", False)
              and (q.device.type == "cuda" if gluon is None else gluon))
    if packed and cfg.persistent and not persistent_docs_ok(q.shape[0], bh // Hq, rows):
        use_ws = False  # short or uneven documents: the persistent walk would lose
    if use_ws and rows and bh:
        descs = tma_descriptors(*_ws_views(mod, cfg, q, k, v, out, packed))
        if descs is not None:
            prog_blocks = (blocks + 1) // 2 if cfg.pair_tiles else blocks
            items = prog_blocks * bh
            # persistent: the packed-documents kernel walks its work items (the dense one takes
            # one per program; check_ws keeps persistent off there)
            persist = bool(cfg.persistent) and packed
            values.update(BLOCK_M=cfg.block_m, KV_STAGES=cfg.num_stages, CONSUMER_REGS=WS_CONSUMER_REGS,
                          PAIR=bool(cfg.pair_tiles), PERSIST=persist, CONSUMERS=cfg.consumers, num_items=items)
            grid = programs(prog_blocks, bh, "q")  # the work items: int32 in the kernel too
            if persist:
                grid = min(grid, sm_count(q.device))
            # packed documents: host descriptors for Q, K and V from each document's first row; O
            # through pointer stores
            return [Launch.of(mod, "_attn_fwd_ws", grid, values, cfg.num_warps, 1,
                           host_part(descs, packed, ("desc_q", "desc_k", "desc_v")),
                           maxnreg=ws_fwd_maxnreg(spec, cfg))]
    if cfg.consumers:  # the warp-specialized kernel cannot take this call: the Triton kernels serve
        cfg = triton_fallback(cfg, spec)
        require_valid(spec, cfg, check_fwd)
    blocks = triton.cdiv(rows, cfg.block_m)
    values.update(num_m_blocks=blocks, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n)
    grid = programs(blocks, bh, "q") if rows and bh else 0
    descs = None
    if cfg.tma and has_entry(mod, "_attn_fwd_tma") and grid:
        descs = tma_descriptors(*_tma_views(mod, cfg, q, k, v, out, packed))
    if descs is not None and not values["OFFS_64"]:
        values.update(WARP_SPEC=bool(cfg.warp_specialize), Q_REGS=bool(cfg.q_regs),
                      PERSISTENT=cfg.persistent > 0, num_tiles=grid)
        if cfg.persistent > 0:
            grid = min(grid, cfg.persistent * sm_count(q.device))
        return [Launch.of(mod, "_attn_fwd_tma", grid, values, cfg.num_warps, cfg.num_stages, descs,
                       maxnreg=cfg.maxnreg)]
    # the pointer kernel: the TMA kernels' knobs do not exist there
    cfg = pointer_fwd_config(cfg, spec)
    require_valid(spec, cfg, check_fwd)
    return [Launch.of(mod, "_attn_fwd", grid, values, cfg.num_warps, cfg.num_stages, maxnreg=cfg.maxnreg)]


def _ws_views(mod: ModuleType, cfg: FwdConfig, q, k, v, out, packed: bool = False) -> tuple[dict, dict]:
    """The warp-specialized kernel's descriptors (views, block shapes, "gluon": its shared-memory
    layouts follow), one per tensor and head-dim column tile as for the TMA kernel: Q and O in
    tiles of one consumer's rows, K and V in key blocks (packed: the (1, H, T, D) views)."""
    rows = cfg.block_m // cfg.consumers
    views, blocks = {}, {}
    for tiles, group in ((mod.QK_TILES, (("q", "Q", q, rows), ("k", "K", k, cfg.block_n))),
                         (mod.V_TILES, (("v", "V", v, cfg.block_n), ("o", "Out", out, rows)))):
        for short, name, tensor, n in group:
            for param, (_, width) in zip(tile_names(f"desc_{short}", tiles), tiles):
                views[param] = (name, descriptor_view(tensor, packed))
                blocks[param] = ([1, 1, n, width], "gluon")
    return views, blocks


def _tma_views(mod: ModuleType, cfg: FwdConfig, q, k, v, out, packed: bool = False) -> tuple[dict, dict]:
    """The TMA kernel's descriptors, one per tensor and head-dim column tile (the module's QK_TILES
    / V_TILES; one tile: desc_q, ...; two: desc_q0, desc_q1, ...): (views, block shapes). Packed
    documents: (1, H, T, D) views of the (T, H, D) tensors, and no O descriptor (the kernel stores
    O through masked pointers, a tile may run past its document)."""
    views, blocks = {}, {}
    groups = ((mod.QK_TILES, (("q", "Q", q, cfg.block_m), ("k", "K", k, cfg.block_n))),
              (mod.V_TILES, (("v", "V", v, cfg.block_n),) + (() if packed else (("o", "Out", out, cfg.block_m),))))
    for tiles, group in groups:
        for short, name, tensor, rows in group:
            for param, (_, width) in zip(tile_names(f"desc_{short}", tiles), tiles):
                views[param] = (name, descriptor_view(tensor, packed))
                blocks[param] = [1, 1, rows, width]
    return views, blocks


def attn_fwd(mod: ModuleType, spec: KernelSpec, q, k, v, out, lse, mask: MaskArgs, cfg: FwdConfig) -> None:
    """Run the dense forward through Triton's JIT (tests, tuner; the runtime caches plans)."""
    for launch in fwd_launches(mod, spec, q, k, v, out, lse, mask, cfg):
        launch.run()


def attn_fwd_varlen(mod: ModuleType, spec: KernelSpec, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                    max_seqlen_q: int, mask: MaskArgs, cfg: FwdConfig) -> None:
    for launch in fwd_launches(mod, spec, q, k, v, out, lse, mask, cfg, cu_seqlens_q, cu_seqlens_k,
                               max_seqlen_q):
        launch.run()
