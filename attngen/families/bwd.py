"""The backward family (`bwd`, templates/attn_bwd.py.jinja): its launches (preprocess, dK/dV and
dQ passes: Gluon, TMA or pointer kernels), the optional kernels a spec's module gets and its Family
record. The launch config, validity filter, search space and default tables are in
attngen.families.bwd_config (and named here as before)."""

from __future__ import annotations

from types import ModuleType

import torch
import triton

from attngen.families.base import WS_MAXNREG, Family, require_valid
from attngen.families.bwd_config import (  # noqa: F401 (the family's names, here as before)
    SHORT_WINDOW, SPACE, TARGET_SPACES, WS_BWD_CONSUMER_REGS, WS_BWD_DEFAULT, WS_BWD_DEFAULT_HD64,
    WS_BWD_DKDV_M64, WS_BWD_HEAD_DIMS, WS_BWD_ROLES, WS_BWD_ROLES_DQ, WS_BWD_TWO_TILE_DEFAULT, WS_EXPR_DEFAULT, WS_EXPR_MAX_HD, BwdConfig, bwd_smem_bytes,
    bwd_triton_fallback, check_bwd, check_ws_bwd, default_bwd_config, expr_short_reach, host_descriptor_bwd,
    pointer_bwd_config, ws_backward, ws_dq_takes)
from attngen.kernels.common import MaskArgs
from attngen.kernels.descriptors import (descriptor_view, host_part, makes_descriptors, tile_names,
                                         tma_descriptors)
from attngen.kernels.launch import (expr_values, Launch, has_entry, lse_strides, needs_int64, programs, roles,
                                    strides4)
from attngen.spec import KernelSpec

# ------------------------------------------------------------------------------------------------
# launches: a call's tensors, mask values and config -> its kernel launches

def bwd_launches(mod: ModuleType, spec: KernelSpec, q, k, v, out, dout, lse, delta, dq, dk, dv,
                 mask: MaskArgs, cfg: BwdConfig, atomic: bool, cu_seqlens_q=None, cu_seqlens_k=None,
                 max_seqlen_q: int = 0, max_seqlen_k: int = 0, gluon: bool | None = None,
                 extra: dict | None = None) -> list[Launch]:
    """Preprocess (delta = rowsum(dO * O)), dK/dV, and dQ unless `atomic` (then `dq` is the fp32
    accumulator the dK/dV kernel adds into, zeroed by the caller). Shapes as fwd_launches; delta
    has lse's shape and strides. gluon: whether the Gluon dK/dV pass may serve (None: on a GPU
    only, as in fwd_launches). Every config a launch runs -- `cfg`, or the Triton / pointer passes'
    fallback -- passes check_bwd (configs.require_valid)."""
    require_valid(spec, cfg, check_bwd)
    packed = cu_seqlens_q is not None
    wide = needs_int64(q, k, v, out, dout, dq, dk, dv, lse)
    # the Gluon passes need a GPU (Triton's interpreter does not run Gluon) and descriptors
    gluon_ok = (has_entry(mod, "_attn_bwd_dkdv_ws") and cfg.tma and not atomic and not wide and q.numel() > 0
                and k.numel() > 0 and (q.device.type == "cuda" if gluon is None else gluon))
    ws_descs = dq_ws_descs = None
    if cfg.consumers and gluon_ok:
        ws_descs = tma_descriptors(*_ws_views(mod, cfg, q, k, v, dout, dk, dv, packed))
    if cfg.dq_consumers and gluon_ok:
        dq_ws_descs = tma_descriptors(*_dq_ws_views(mod, cfg, q, k, v, dout, dq, packed))
    # a pass the Gluon kernel cannot take: its Triton kernel serves
    cfg = bwd_triton_fallback(cfg, dkdv=ws_descs is None, dq=dq_ws_descs is None)
    require_valid(spec, cfg, check_bwd)
    Hq, Hkv = (q.shape[1], k.shape[1])
    if packed:
        docs = cu_seqlens_q.numel() - 1
        bq, bk, seqlen_q, seqlen_k, diag = docs * Hq, docs * Hkv, 0, 0, 0
        rows_q = max_seqlen_q if q.shape[0] else 0
        rows_k = max_seqlen_k if k.shape[0] else 0
    else:
        B, _, seqlen_q, _ = q.shape
        seqlen_k = k.shape[2]
        bq, bk, rows_q, rows_k = B * Hq, B * Hkv, seqlen_q, seqlen_k
        diag = mask.diag_offset(seqlen_q, seqlen_k)
    qk_scale, softcap_in, softcap_out = mask.score_args()
    common = {
        "Q": q, "K": k, "V": v, "Out": out, "DO": dout, "DQ": dq, "DK": dk, "DV": dv, "Lse": lse,
        "Delta": delta, "cu_seqlens_q": cu_seqlens_q, "cu_seqlens_k": cu_seqlens_k,
        **strides4("q", q, packed), **strides4("k", k, packed), **strides4("v", v, packed),
        **strides4("o", out, packed), **strides4("do", dout, packed), **strides4("dq", dq, packed),
        **strides4("dk", dk, packed), **strides4("dv", dv, packed), **lse_strides(lse, packed),
        "num_q_heads": Hq, "num_kv_heads": Hkv, "seqlen_q": seqlen_q, "seqlen_k": seqlen_k,
        "qk_scale": qk_scale, "ds_scale": mask.scale, "softcap_in": softcap_in,
        "softcap_out": softcap_out, "diag_offset": diag, "window_left": mask.window_left,
        "window_right": mask.window_right, "ALIGN_TOP_LEFT": mask.align_top_left, "OFFS_64": wide,
        "PAD_QK": spec.pad_qk, "PAD_V": spec.pad_v, "GQA": spec.gqa_ratio, **expr_values(extra),
    }
    ok = rows_q > 0 and rows_k > 0

    def passes(cfg: BwdConfig):
        """The preprocess launch, the dK/dV and dQ passes' values and grids for `cfg`'s tiles."""
        n_blocks = triton.cdiv(rows_k, cfg.block_n)
        dq_blocks = triton.cdiv(rows_q, cfg.dq_block_m)  # the preprocess takes the dQ pass's rows
        pre = Launch.of(mod, "_attn_bwd_preprocess", programs(dq_blocks, bq, "q") if ok else 0,
                     {**common, "num_m_blocks": dq_blocks, "BLOCK_M": cfg.dq_block_m}, 4, 1)
        dkdv_values = {**common, "num_n_blocks": n_blocks, "ATOMIC_DQ": atomic, "BLOCK_M": cfg.block_m,
                       "BLOCK_N": cfg.block_n}
        dq_values = {**common, "num_m_blocks": dq_blocks, "BLOCK_M": cfg.dq_block_m,
                     "BLOCK_N": cfg.dq_block_n}
        return (pre, dkdv_values, dq_values, programs(n_blocks, bk, "k") if ok else 0,
                programs(dq_blocks, bq, "q") if ok else 0)

    pre, dkdv_values, dq_values, dkdv_grid, dq_grid = passes(cfg)
    if cfg.tma and not wide and ok and has_entry(mod, "_attn_bwd_dkdv_tma"):
        tensors = {"Q": q, "K": k, "V": v, "DO": dout, "DQ": dq, "DK": dk, "DV": dv}
        dkdv_descs = tma_descriptors(*_tma_views(mod, tensors, cfg.block_m, cfg.block_n, packed=packed))
        dq_descs = tma_descriptors(*_tma_views(mod, tensors, cfg.dq_block_m, cfg.dq_block_n, True, packed))
        if dkdv_descs is not None and dq_descs is not None:  # else a stride the copy engine cannot take
            # packed documents: kernels that make their descriptors per document (no descriptor
            # parameter) take the tensors and strides; the views above only checked alignment
            per_doc = "desc" not in roles(mod, "_attn_bwd_dkdv_tma").values()
            if per_doc:
                dkdv_descs = dq_descs = None
            # the Gluon passes; packed documents: the host descriptors of the tensors the kernels do
            # not bound per document (the views above checked that the copy engine can address all)
            if ws_descs is not None:
                launches = [pre, Launch.of(mod, "_attn_bwd_dkdv_ws", dkdv_grid,
                                        {**dkdv_values, "STAGES": cfg.num_stages, "CONSUMER_REGS": WS_BWD_CONSUMER_REGS,
                                         "ROLES": cfg.roles},
                                        cfg.num_warps, 1, host_part(ws_descs, mod, "_attn_bwd_dkdv_ws"),
                                        scratch=packed and makes_descriptors(mod, "_attn_bwd_dkdv_ws", "desc_q"),
                                        maxnreg=WS_MAXNREG)]
            else:
                wants = [(True, False), (False, True)] if cfg.split_dkdv else [(True, True)]
                launches = [pre] + [
                    Launch.of(mod, "_attn_bwd_dkdv_tma", dkdv_grid, {**dkdv_values, "WANT_DK": dk_, "WANT_DV": dv_},
                           cfg.num_warps, cfg.num_stages, dkdv_descs, scratch=per_doc)
                    for dk_, dv_ in wants]
            if dq_ws_descs is not None:
                launches.append(Launch.of(mod, "_attn_bwd_dq_ws", dq_grid,
                                          {**dq_values, "STAGES": cfg.dq_num_stages,
                                           "CONSUMER_REGS": WS_BWD_CONSUMER_REGS},
                                          cfg.dq_num_warps, 1, host_part(dq_ws_descs, mod, "_attn_bwd_dq_ws"),
                                          scratch=packed and makes_descriptors(mod, "_attn_bwd_dq_ws", "desc_k"),
                                          maxnreg=WS_MAXNREG))
                return launches
            if not atomic:
                launches.append(Launch.of(mod, "_attn_bwd_dq_tma", dq_grid,
                                          {**dq_values, "OPS_REGS": bool(cfg.dq_regs)},
                                          cfg.dq_num_warps, cfg.dq_num_stages, dq_descs, scratch=per_doc))
            return launches
    # the pointer passes: the TMA and Gluon passes' knobs do not exist there
    pointer_cfg = pointer_bwd_config(cfg)
    require_valid(spec, pointer_cfg, check_bwd)
    if pointer_cfg != cfg:
        cfg = pointer_cfg
        pre, dkdv_values, dq_values, dkdv_grid, dq_grid = passes(cfg)
    launches = [pre, Launch.of(mod, "_attn_bwd_dkdv", dkdv_grid, dkdv_values, cfg.num_warps, cfg.num_stages)]
    if not atomic:
        launches.append(Launch.of(mod, "_attn_bwd_dq", dq_grid, dq_values, cfg.dq_num_warps, cfg.dq_num_stages))
    return launches


def _gluon_views(packed: bool, *entries) -> tuple[dict, dict]:
    """(views, block shapes) of Gluon descriptors: (short name, tensor name, tensor, rows, tiles)
    each, one descriptor per head-dim column tile of `tiles` (a module's QK_TILES / V_TILES:
    desc_q for one tile, desc_q0, desc_q1, ... for more); "gluon": their shared-memory layouts
    follow (tma_descriptors)."""
    views, blocks = {}, {}
    for short, name, tensor, rows, tiles in entries:
        for param, (_, width) in zip(tile_names(f"desc_{short}", tiles), tiles):
            views[param] = (name, descriptor_view(tensor, packed))
            blocks[param] = ([1, 1, rows, width], "gluon")
    return views, blocks


def _ws_views(mod: ModuleType, cfg: BwdConfig, q, k, v, dout, dk, dv, packed: bool = False) -> tuple[dict, dict]:
    """The Gluon dK/dV pass's descriptors: Q and dO in ring slots of block_m rows, K, V, dK, dV in
    one consumer's keys (all block_n with roles), per head-dim column tile."""
    n = cfg.block_n if cfg.roles else cfg.block_n // cfg.consumers
    qt, vt = mod.QK_TILES, mod.V_TILES
    return _gluon_views(packed, ("q", "Q", q, cfg.block_m, qt), ("do", "DO", dout, cfg.block_m, vt),
                        ("k", "K", k, n, qt), ("v", "V", v, n, vt), ("dk", "DK", dk, n, qt), ("dv", "DV", dv, n, vt))


def _dq_ws_views(mod: ModuleType, cfg: BwdConfig, q, k, v, dout, dq, packed: bool = False) -> tuple[dict, dict]:
    """The Gluon dQ pass's descriptors: Q, dO, dQ in one consumer's rows, K and V in ring slots of
    dq_block_n keys, per head-dim column tile."""
    m = cfg.dq_block_m // cfg.dq_consumers
    qt, vt = mod.QK_TILES, mod.V_TILES
    return _gluon_views(packed, ("q", "Q", q, m, qt), ("do", "DO", dout, m, vt), ("dq", "DQ", dq, m, qt),
                        ("k", "K", k, cfg.dq_block_n, qt), ("v", "V", v, cfg.dq_block_n, vt))


def _tma_views(mod: ModuleType, tensors: dict, rows_m: int, rows_n: int, dq_pass: bool = False,
               packed: bool = False):
    """The sm90 TMA kernels' descriptors over the (B, H, S, D) views, one per tensor and head-dim
    column tile (QK_TILES for Q, K, dQ, dK; V_TILES for V, dO, dV): query-side tiles of rows_m
    rows, key-side tiles of rows_n; the dQ pass has no dK / dV. Packed documents: (1, H, T, D)
    views, and no store descriptors (dK / dV, the dQ pass's dQ: masked pointer stores); the dK/dV
    pass keeps dQ's for the reduce-adds of atomic_dq (rows past a document add zeros). (views,
    block shapes) for tma_descriptors."""
    views, blocks = {}, {}
    groups = [("q", "Q", "qk", rows_m), ("k", "K", "qk", rows_n), ("v", "V", "v", rows_n),
              ("do", "DO", "v", rows_m)]
    if not (packed and dq_pass):
        groups.append(("dq", "DQ", "qk", rows_m))
    if not (dq_pass or packed):
        groups += [("dk", "DK", "qk", rows_n), ("dv", "DV", "v", rows_n)]
    for short, name, which, rows in groups:
        tiles = mod.QK_TILES if which == "qk" else mod.V_TILES
        for param, (_, width) in zip(tile_names(f"desc_{short}", tiles), tiles):
            views[param] = (name, descriptor_view(tensors[name], packed))
            blocks[param] = [1, 1, rows, width]
    return views, blocks


def attn_bwd(mod: ModuleType, spec: KernelSpec, q, k, v, out, dout, lse, dq, dk, dv,
             mask: MaskArgs, cfg: BwdConfig, deterministic: bool, cu_seqlens_q=None,
             cu_seqlens_k=None, max_seqlen_q: int = 0, max_seqlen_k: int = 0) -> None:
    """Run the backward through Triton's JIT (tests, tuner). Writes dq, dk, dv; dQ comes from fp32
    atomics only when cfg.atomic_dq and not `deterministic`."""
    if q.numel() == 0 or k.numel() == 0:
        dq.zero_(), dk.zero_(), dv.zero_()
        return
    atomic = cfg.atomic_dq and not deterministic
    delta = torch.empty_like(lse)
    dq_acc = torch.zeros(dq.shape, dtype=torch.float32, device=dq.device) if atomic else dq
    for launch in bwd_launches(mod, spec, q, k, v, out, dout, lse, delta, dq_acc, dk, dv, mask, cfg,
                               atomic, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
        launch.run()
    if atomic:
        dq.copy_(dq_acc)


def attn_bwd_varlen(mod: ModuleType, spec: KernelSpec, q, k, v, out, dout, lse, dq, dk, dv,
                    cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int,
                    mask: MaskArgs, cfg: BwdConfig, deterministic: bool) -> None:
    attn_bwd(mod, spec, q, k, v, out, dout, lse, dq, dk, dv, mask, cfg, deterministic, cu_seqlens_q,
             cu_seqlens_k, max_seqlen_q, max_seqlen_k)


def variants(spec: KernelSpec) -> dict[str, bool]:
    """The optional kernels of `spec`'s module: the warp-specialized Gluon passes."""
    return {"ws": ws_backward(spec)}


FAMILY = Family(
    "bwd", "attn_bwd.py.jinja", BwdConfig, check_bwd,
    lambda spec, kind, seqlen_q=0, window=None: default_bwd_config(spec, kind, window),
    ("_attn_bwd_preprocess", "_attn_bwd_dkdv", "_attn_bwd_dq", "_attn_bwd_dkdv_tma", "_attn_bwd_dq_tma",
     "_attn_bwd_dkdv_ws", "_attn_bwd_dq_ws"), "attngen.families.bwd:bwd_launches", 2.5, ("dq", "dk", "dv"),
    space=SPACE, target_spaces=TARGET_SPACES, portable=lambda cfg, spec: pointer_bwd_config(cfg),
    variants=variants, hooks="attngen.families.bwd_tuning:TuningHooks", host_descriptors=host_descriptor_bwd)
