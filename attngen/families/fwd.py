"""The forward family (`fwd`, templates/attn_fwd.py.jinja): its launch config, validity filter,
search space, default tables, the optional kernels a spec's module gets, its launches (a call's
tensors, mask values and config -> the Gluon, TMA or pointer kernel's launch) and its Family
record."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import ModuleType

import triton

from attngen.families.base import SMEM_LIMIT, WS_MAXNREG, Family, _pow2, require_valid
from attngen.kernels.common import MaskArgs
from attngen.spec import expr as X
from attngen.families.bwd_config import WS_EXPR_DEFAULT, WS_EXPR_MAX_HD, expr_short_reach
from attngen.spec.expr_terms import mask_node, score_node
from attngen.kernels.descriptors import descriptor_view, host_part, tile_names, tma_descriptors
from attngen.kernels.launch import (expr_values, Launch, call_extent, has_entry, lse_strides, needs_int64, programs,
                                    sm_count, strides4)
from attngen.spec import KernelSpec, head_chunks


@dataclass(frozen=True)
class FwdConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    # sm90 family: Q/K/V/O through TMA tensor descriptors (calls with 16-byte aligned rows, packed
    # documents included; others fall back to pointer loads), and the key loop warp-specialized
    # (producer warps issue the TMA loads, consumer warps compute; needs tma, and runs the mask
    # stages as one loop)
    tma: bool = False
    warp_specialize: bool = False
    # online softmax: move a row's running max only when it grows by more than 8 (log2 domain) and
    # rescale the accumulator only when some row's max moved (exact: O and lse share the max). On
    # the H200 it won with 128x128 TMA tiles and lost with the pointer kernel
    # (h200_ab_softmax_2026-11-30.json)
    lazy_rescale: bool = False
    # sm90 TMA kernel: 0 = one program per tile; n > 0 = n programs per SM, each looping over tiles
    # (the Gluon kernel over packed documents: 0 or 1; its producer then loads the next tile's Q
    # and K / V during the current tile's last blocks and epilogue)
    persistent: int = 0
    # sm90 TMA kernel: the Q tile held in registers for Q.K^T (wgmma's A operand from registers)
    # instead of read from shared memory for every key block
    q_regs: bool = False
    # ptxas's register cap per thread (0: the compiler's choice): under 168 registers three 4-warp
    # programs fit on an SM (65536 registers, allocated per warp in steps of 256)
    maxnreg: int = 0
    # sm90 family, calls of head dim 64, 128, 192 or 256 without softcapping, dense or packed
    # documents (the module's WS_FWD): the Gluon kernel _attn_fwd_ws -- one producer warp fills a ring of
    # num_stages K / V buffers through TMA and `consumers` warp groups (num_warps = 4 each) of
    # block_m // consumers query rows compute from it; maxnreg: the kernel's register cap (0: 168
    # with two consumers, which then take 232 each; 128 with one, so that two programs share an
    # SM). 0: the Triton kernels
    consumers: int = 0
    # the Gluon kernel (consumers > 0): each program runs two query tiles of one (batch, head) or
    # document, block p and its mirror n - 1 - p (equal work under a causal mask), the second
    # one's K / V loads in flight during the first one's epilogue; half the programs
    pair_tiles: bool = False

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)



def fwd_smem_bytes(spec: KernelSpec, cfg: FwdConfig) -> int:
    """Shared-memory need (2-byte elements): the Q tile once (none with q_regs: it stays in
    registers), K and V tiles per pipeline stage. Matches what Triton 3.6 asked for on the H200
    sweeps to the byte (hd128 64x128 s4: 278528, 128x128 s4: 294912; hd256 64x128 s2: 294912;
    h200_sweep*_2026-11-30.json), and its sm90 compile of the TMA kernel, hd128 64x64 s3, up to
    barriers and alignment (115712 vs 114688; with q_regs 98360 vs 98304;
    attngen/bench/probe.py)."""
    policy = "split" if cfg.tma else "pad"  # the pointer kernel holds one padded tile
    dqk = sum(w for _, w in spec.head_chunks("qk", policy))
    dv = sum(w for _, w in spec.head_chunks("v", policy))
    q_tile = 0 if (cfg.q_regs and cfg.tma) else cfg.block_m * dqk
    return 2 * (q_tile + cfg.num_stages * cfg.block_n * (dqk + dv))


def ws_forward(spec: KernelSpec) -> bool:
    """The forward gets the warp-specialized Gluon kernel (templates/_mainloop_ws.py.jinja, dense
    calls and packed documents; FwdConfig.consumers): sm90 family, no
    softcapping, the same
    head dim for Q, K and V, one of WS_HEAD_DIMS (192 runs as two column tiles, 128 + 64;
    softcapping and the other head dims keep the Triton kernels). Expression kernels (mask and
    score expressions, sinks) take it for dense calls; their packed documents keep the Triton
    kernels."""
    return (spec.family == "fwd" and spec.target == "sm90" and not spec.softcap
            and not (spec.has_expr and (spec.varlen or _gathers(spec)))
            and spec.head_dim_qk == spec.head_dim_v and spec.head_dim_qk in WS_HEAD_DIMS)


def _short_reach(spec: KernelSpec) -> bool:
    """A mask expression keeping each query's keys within SHORT_WINDOW, or the built-in window
    with expressions or sinks beside it (its width is a call's value; gpt-oss's is 128)."""
    return spec.mask == "sliding_window" or expr_short_reach(spec)


def _gathers(spec: KernelSpec) -> bool:
    """An expression with a parameter subscripted by a tile index (document ids, T5's bias
    buckets): Triton 3.6's Gluon lowering asserts on those loads in the forward's consumers
    (ConvertTritonGPUToLLVM: a SmallVector index out of range; the backward's passes compile
    them), so those keep the Triton TMA forward."""
    return any(isinstance(m, X.Sub) and any(X.uses(i, "q_idx") or X.uses(i, "kv_idx") for i in m.idx)
               for node in (mask_node(spec), score_node(spec)) if node is not None for m in X.walk(node))


WS_HEAD_DIMS = (64, 128, 192, 256)

# the Gluon forward's registers:
WS_CONSUMER_REGS = 232  # what each consumer warp group takes back from the producer's 24
# one consumer warp group per program (consumers=1): two programs per SM, each launched at 128
# registers for its two warp groups (the consumer then takes 232, the producer keeps 24)
WS_MAXNREG_ONE = 128


def ws_fwd_maxnreg(spec: KernelSpec, cfg: FwdConfig) -> int:
    """The Gluon forward's launch register cap when cfg.maxnreg leaves it to the launcher. One
    consumer past head dim 192 takes WS_MAXNREG: ptxas needs 158 registers for its 64 x 256 fp32
    accumulator's wgmma at launch and fails at 128 (attngen/bench/probe.py), and the ring of
    64-key blocks fills ~164 KB of shared memory, one program per SM whatever the registers."""
    if cfg.maxnreg:
        return cfg.maxnreg
    if cfg.consumers == 1 and max(spec.head_dim_qk, spec.head_dim_v) <= 192:
        return WS_MAXNREG_ONE
    return WS_MAXNREG


def check_ws(spec: KernelSpec, cfg: FwdConfig) -> str | None:
    """The warp-specialized Gluon forward's own constraints (cfg.consumers > 0)."""
    if not ws_forward(spec):
        return ("consumers (the warp-specialized Gluon forward) exists for sm90 calls of head "
                f"dim {', '.join(map(str, WS_HEAD_DIMS))} (Q, K and V alike) without softcapping only")
    if cfg.consumers not in (1, 2):
        return "consumers is 0 (the Triton kernels), 1 or 2 (consumer warp groups per program)"
    if not cfg.tma:
        return "consumers needs tma (the producer warp issues TMA loads)"
    if cfg.block_m != 64 * cfg.consumers or cfg.num_warps != 4:
        return "consumers: each consumer is one warp group of 64 query rows (block_m = 64 x consumers, num_warps = 4)"
    if cfg.block_n not in (64, 128):
        return "consumers: block_n is 64 or 128"
    if cfg.q_regs or cfg.warp_specialize or cfg.lazy_rescale:
        return "consumers: q_regs, warp_specialize and lazy_rescale are Triton-kernel knobs"
    if cfg.persistent not in (0, 1):
        return "consumers: persistent is 0 (one program per work item) or 1 (one program per SM)"
    if cfg.persistent and not spec.varlen:
        return "consumers: persistent exists in the packed-documents Gluon forward only"
    return None


def triton_fallback(cfg: FwdConfig, spec: KernelSpec | None = None) -> FwdConfig:
    """The Triton kernels' config that serves a call the warp-specialized forward cannot take (rows
    not 16-byte aligned for the copy engine, a host-bound shape, a CPU tensor): the Triton
    kernels' sm90 default for `spec`'s head dim (hd128's without a spec), pointer loads when
    `cfg` turned the copy engine off."""
    if not cfg.consumers:
        return cfg
    d = max(spec.head_dim_qk, spec.head_dim_v) if spec is not None else 128
    base = _sm90_fwd_default(d, spec.varlen if spec is not None else False)
    return base if cfg.tma else dataclasses.replace(base, tma=False, q_regs=False)


def pointer_fwd_config(cfg: FwdConfig, spec: KernelSpec) -> FwdConfig:
    """The config the pointer kernel `_attn_fwd` runs for `cfg` when the copy engine cannot serve
    a call (a host-bound shape, tensors not 16-byte aligned, offsets past 2^31): the Triton
    kernels' tiles (a warp-specialized config names the ones it falls back to) with every knob of
    the TMA and Gluon kernels off, so that the config passes check_fwd for the pointer kernel."""
    cfg = dataclasses.replace(triton_fallback(cfg, spec), tma=False, warp_specialize=False, q_regs=False,
                              persistent=0, consumers=0, pair_tiles=False)
    # its padded tile can need more shared memory than the TMA kernel's column tiles: fewer stages
    have = SMEM_LIMIT.get(spec.target, SMEM_LIMIT["sm80"])
    while cfg.num_stages > 1 and fwd_smem_bytes(spec, cfg) > have:
        cfg = dataclasses.replace(cfg, num_stages=cfg.num_stages - 1)
    return cfg


def split_head_dim(spec: KernelSpec) -> bool:
    """The TMA kernels hold a head dim of `spec` as two column tiles (80 = 64 + 16, ...)."""
    return len(spec.head_chunks("qk")) > 1 or len(spec.head_chunks("v")) > 1


def check_fwd(spec: KernelSpec, cfg: FwdConfig) -> str | None:
    """None if `cfg` can launch `spec`'s forward kernel, else the reason (the tuner records it)."""
    if not (_pow2(cfg.block_m) and _pow2(cfg.block_n)):
        return "block sizes must be powers of two"
    if cfg.block_m < 16 or cfg.block_n < 16:
        return "block sizes below 16 do not map onto tensor-core tiles"
    if cfg.num_warps not in (1, 2, 4, 8, 16):
        return "num_warps must be 1, 2, 4, 8 or 16"
    if cfg.num_stages < 1:
        return "num_stages must be >= 1"
    if cfg.consumers:
        why = check_ws(spec, cfg)
        if why:
            return why
    elif cfg.pair_tiles:
        return "pair_tiles exists in the warp-specialized Gluon forward only (needs consumers)"
    need, have = fwd_smem_bytes(spec, cfg), SMEM_LIMIT.get(spec.target, SMEM_LIMIT["sm80"])
    if need > have:
        return f"needs ~{need} B of shared memory, {spec.target} has {have}"
    if (cfg.tma or cfg.warp_specialize) and spec.target != "sm90":
        return "tma / warp_specialize exist in the sm90 family's kernels only"
    if cfg.maxnreg and not (24 <= cfg.maxnreg <= 255 and cfg.maxnreg % 8 == 0):
        return "maxnreg is 0 (the compiler's choice) or a multiple of 8 from 24 to 255"
    if cfg.q_regs and not cfg.tma:
        return "q_regs exists in the sm90 family's TMA kernel only (needs tma)"
    if cfg.tma and not cfg.consumers and spec.varlen and split_head_dim(spec):
        return ("tma over packed documents takes head dims of one column tile (the two-tile TMA "
                "kernel read shared memory out of range on the H200 with Triton 3.6)")
    if cfg.persistent and not cfg.tma:
        return "persistent exists in the sm90 family's TMA kernel only (needs tma)"
    if cfg.persistent < 0:
        return "persistent is a number of programs per SM (0 = one program per tile)"
    if cfg.warp_specialize and not cfg.tma:
        return "warp_specialize needs tma (the producer warps issue TMA loads)"
    if cfg.warp_specialize and cfg.num_warps < 8:
        # measured on the H200 with Triton 3.6: 64x64, 4 warps, 3 stages, warp-specialized gave NaN
        # on every case (h200_hopper_probe_2026-11-30.json)
        return "warp_specialize with fewer than 8 warps computed wrong results on Triton 3.6"
    return None


SPACE: dict[str, tuple] = {
    "block_m": (64, 128),
    "block_n": (32, 64, 128),
    "num_warps": (4, 8),
    "num_stages": (1, 2, 3, 4),
    "lazy_rescale": (False, True),
}
# warp_specialize stays a knob but out of the default search: it lost on every H200 probe case. The
# Gluon kernel's knobs (consumers, pair_tiles) are in it: that kernel is the sm90 default, so the
# tuner measures it beside the Triton kernels (check_ws drops the combinations that cannot launch
# before any compile)
TARGET_SPACES: dict[str, dict[str, tuple]] = {
    "sm90": {"consumers": (0, 1, 2), "tma": (False, True), "pair_tiles": (False, True), "q_regs": (False, True)},
}


def default_fwd_config(spec: KernelSpec, device_kind: str = "cuda", seqlen_q: int = 0) -> FwdConfig:
    """Defaults per head dim, the best of the H200 config sweep (benchmarks/results/
    h200_sweep_2026-11-30.json; that sweep is `attngen tune --sampler grid` now); the interpreter
    gets big tiles because its cost is per tile operation."""
    d = max(spec.head_dim_qk, spec.head_dim_v)
    if device_kind == "cpu":
        return FwdConfig(64, 64, 4, 1)
    if spec.target == "sm90":
        ws = WS_DEFAULT if d <= 128 else WS_DEFAULT_WIDE
        if spec.has_expr and (not WS_EXPR_DEFAULT or d > WS_EXPR_MAX_HD or _short_reach(spec)):
            # see families/bwd_config.py; a mask of short reach (gpt-oss's 128-key window with sinks, hd64)
            # ran 3.66x Flex on the Triton forward and 2.12x on the Gluon one (H100,
            # benchmarks/results/h100_bench_mods_gluon_2026-12-06.json)
            return _sm90_fwd_default(d, spec.varlen)
        if spec.score_expr:
            # a score modification's per-score work on 64 x 128 tiles a consumer spills (ALiBi: 216
            # bytes, ptxas via attngen.bench.probe); 64-key blocks do not
            ws = dataclasses.replace(ws, block_n=64)
        # packed documents: one Gluon program per item lost to the Triton kernel (8 causal
        # 1024-token documents, GQA 32/8: 308 vs 347 TFLOP/s; 8 uneven documents 365 vs 399), its
        # one-program-per-SM prologue and epilogue exposed on short documents
        # (h200_ab_varlen_ws2_2026-12-01.json; pairs and one-consumer programs: best 337 and 343,
        # h200_ab_fwd_pair_2026-12-01.json). One persistent program per SM walking mirrored
        # pairs won where the documents are of about equal length (WS_DOCS, hd128 only measured);
        # elsewhere the launcher gives the call to the Triton kernel (persistent_docs_ok)
        if spec.varlen and d == 128 and check_fwd(spec, WS_DOCS) is None:
            return WS_DOCS
        if not spec.varlen and check_fwd(spec, ws) is None:
            if d > 192 and spec.mask == "causal":
                # two mirrored query tiles per program: causal hd256 B2 H16 S4096 653 vs 618
                # TFLOP/s; hd192 598 vs 607 and hd128 (-9 % at S16384, -12 % on a window, +3 % on
                # GQA 32/8) keep one tile (h200_ab_fwd_pair_2026-12-01.json)
                return dataclasses.replace(ws, pair_tiles=True)
            return ws
        return _sm90_fwd_default(d, spec.varlen)
    if d <= 64:
        return FwdConfig(128, 64, 8, 4)
    if d <= 128:
        # short sequences (and packed documents up to 1k) fill the GPU better with 64-row tiles:
        # 315 vs 295 TFLOP/s on 8 x 1024-token causal documents; a 1024-key window too: 348 vs
        # 334 (h200_sweep_split_2026-11-30.json)
        if spec.mask == "sliding_window":
            return FwdConfig(64, 64, 4, 2)
        return FwdConfig(64, 64, 4, 3) if 0 < seqlen_q <= 1024 else FwdConfig(128, 64, 8, 3)
    # hd256 (and hd192, one padded tile in the pointer kernel): the best of the H200 sweep that fits
    # an sm80 GPU's 163 KB of shared memory, 339 TFLOP/s (128x64x8x2 gave 398 on the H200 but needs
    # 192 KB; h200_sweep_hd256_2026-11-30.json)
    return FwdConfig(64, 32, 4, 2)


# The warp-specialized Gluon forward (FwdConfig.consumers) where it exists: 128 query rows over two
# consumer warp groups, 128-key blocks, a 2-deep K / V ring. H200, bf16, TFLOP/s beside the Triton
# kernel's default and cuDNN in one run (benchmarks/tools/gluon_fwd.py, removed: in git at 486282c;
# h200_gluon_fwd_2026-12-01.json):
# full 593 vs 538 (cuDNN 663), causal S4096 529 vs 445 (516), causal S16384 617 vs 512 (545), GQA
# 32/8 S8192 571 vs 475 (550), causal hd64 400 vs 387 (434); 64-key blocks with 3-4 stages 478-555.
WS_DEFAULT = FwdConfig(128, 128, 4, 2, tma=True, consumers=2)
# hd192 / hd256: 64-key blocks (two 128-key stages do not fit beside Q), Q in shared memory. Causal
# hd256 B2 H16 S4096: 603 TFLOP/s vs 313-465 for the Triton kernels, cuDNN 601
# (h200_ab_ws_2026-12-01.json); causal hd192 B4 H16 S4096: 572 (573 with 3 stages) vs 471, cuDNN
# 618 (h200_ab_ws192_2026-12-01.json)
WS_DEFAULT_WIDE = FwdConfig(128, 64, 4, 2, tma=True, consumers=2)
# Packed documents, hd128: one program per SM (persistent) walking items of two mirrored query
# tiles of one document (equal causal work per item), 64-key blocks, 2 stages; its producer loads the
# next tile's Q and K / V during the current tile's last blocks and epilogue. 8 causal 1024-token
# documents, GQA 32/8: 366 and 364 TFLOP/s vs 349 for the Triton kernel's default in the same run,
# 3 stages 363, one item per program 343, one tile per item (block-major order) 301-332
# (h200_ab_varlen_persist2_2026-12-01.json; the run before, h200_ab_varlen_persist_2026-12-01.json:
# 363 vs 347). On 8 uneven documents (3000 ... 292 tokens) the static walk is unbalanced (297 vs
# 399): see EVEN_DOCS.
WS_DOCS = FwdConfig(128, 64, 4, 2, tma=True, consumers=2, pair_tiles=True, persistent=1)
# A persistent Gluon forward over packed documents walks its items statically (program p takes
# items p, p + programs, ...); items past a short document's end are empty, so with documents of
# uneven length the heavy items crowd onto a few programs. The launcher gives such a call (mean
# document length below EVEN_DOCS of the longest) to the Triton kernels, and calls whose longest
# document is under DOCS_MIN_LEN tokens too (measured on 1024-token documents; on shorter ones
# one program per SM walks items of a few key blocks each one after the other, where the Triton
# kernel runs several programs per SM side by side).
EVEN_DOCS = 0.9
DOCS_MIN_LEN = 1024


def persistent_docs_ok(total_q: int, docs: int, max_seqlen_q: int) -> bool:
    """Whether packed documents of these sizes suit the persistent Gluon forward's static walk."""
    return max_seqlen_q >= DOCS_MIN_LEN and total_q >= EVEN_DOCS * docs * max_seqlen_q


def _sm90_fwd_default(d: int, varlen: bool = False) -> FwdConfig:
    """The sm90 family's Triton-kernel forward per head dim (measurements: docs/defaults.md)."""
    if varlen and len(head_chunks(d)) > 1:  # the TMA kernel takes packed documents at one tile only
        return FwdConfig(128, 64, 8, 3) if d < 128 else FwdConfig(64, 64, 4, 2)
    regs = not varlen
    if d <= 64:
        return FwdConfig(64, 64, 4, 3, tma=True, q_regs=regs)
    if d <= 80:
        return FwdConfig(64, 64, 4, 2, tma=True)
    if d < 128:
        return FwdConfig(64, 64, 4, 3, tma=True, q_regs=True) if regs else FwdConfig(128, 64, 8, 3, tma=True)
    if d == 128:
        return FwdConfig(64, 64, 4, 3, tma=True, q_regs=regs)
    if d <= 192 and len(head_chunks(d)) > 1:  # 160 = 128 + 32, 192 = 128 + 64, ...
        return FwdConfig(128, 64, 8, 3, tma=True)
    # hd256, and head dims held as one padded 256-column tile (168, 176): 128 x 64 with three
    # stages needs 256 KB of shared memory there
    return FwdConfig(64, 64, 4, 3, tma=True, lazy_rescale=True)

# ------------------------------------------------------------------------------------------------
# launches: a call's tensors, mask values and config -> its kernel launches

def fwd_launches(mod: ModuleType, spec: KernelSpec, q, k, v, out, lse, mask: MaskArgs, cfg: FwdConfig,
                 cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q: int = 0,
                 gluon: bool | None = None, extra: dict | None = None) -> list[Launch]:
    """Dense: q (B, Hq, Sq, D), k/v (B, Hkv, Sk, D), out (B, Hq, Sq, Dv), lse (B, Hq, Sq) fp32, any
    strides (a bshd tensor is passed as its permuted view). Packed (cu_seqlens given): q (Tq, Hq, D),
    k/v (Tk, Hkv, D), out (Tq, Hq, Dv), lse (Hq, Tq). gluon: whether a Gluon kernel may serve
    (None: on a GPU only; Triton's interpreter does not run Gluon; the compile probe says True).
    Every config a launch runs -- `cfg`, or the fallback the Triton or pointer kernel takes when the
    Gluon or TMA kernel cannot serve the call -- passes check_fwd (configs.require_valid)."""
    require_valid(spec, cfg, check_fwd)
    packed = cu_seqlens_q is not None
    Hq, bh, seqlen_q, seqlen_k, rows = call_extent(q, k, cu_seqlens_q, max_seqlen_q)
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
        "GQA": spec.gqa_ratio, **expr_values(extra),
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
                           host_part(descs, mod, "_attn_fwd_ws"),
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


def variants(spec: KernelSpec) -> dict[str, bool]:
    """The optional kernels of `spec`'s module: the warp-specialized Gluon forward."""
    return {"ws": ws_forward(spec)}


FAMILY = Family(
    "fwd", "attn_fwd.py.jinja", FwdConfig, check_fwd,
    lambda spec, kind, seqlen_q=0, window=None: default_fwd_config(spec, kind, seqlen_q),
    ("_attn_fwd", "_attn_fwd_tma", "_attn_fwd_ws"), "attngen.families.fwd:fwd_launches", 1.0, ("out", "lse"),
    space=SPACE, target_spaces=TARGET_SPACES, portable=lambda cfg, spec: pointer_fwd_config(cfg, spec),
    variants=variants, hooks="attngen.families.fwd_tuning:TuningHooks")
