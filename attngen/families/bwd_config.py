"""The backward family's configs (attngen.families.bwd has its launches): the launch config, its
validity filter and search space, which specs get the warp-specialized Gluon passes, and the
default tables."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from attngen.families.base import SMEM_LIMIT, _pow2
from attngen.spec import KernelSpec
from attngen.spec.expr_terms import exact_d, grad_terms, key_reach, mask_node


@dataclass(frozen=True)
class BwdConfig:
    """dK/dV kernel tiles (block_m queries x block_n keys) and the dQ kernel's tiles."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    dq_block_m: int
    dq_block_n: int
    dq_num_warps: int
    dq_num_stages: int
    atomic_dq: bool = False  # dQ by fp32 atomics inside the dK/dV kernel instead of its own pass
    # sm90 family: both passes move their (rows x head dim) tiles through TMA tensor descriptors
    # (_attn_bwd_dkdv_tma, _attn_bwd_dq_tma; packed documents: loads only), and with atomic_dq each
    # fp32 dQ tile goes into the accumulator through one TMA reduce-add instead of per-element atomics
    tma: bool = False
    # sm90 TMA dK/dV kernel: dK and dV from two launches (one accumulator each, half the registers;
    # both recompute P, five key-side matmuls instead of four) instead of one
    split_dkdv: bool = False
    # sm90 TMA dQ pass: its Q and dO tiles held in registers (wgmma's A operand of Q.K^T and dO.V^T
    # from registers) instead of read from shared memory for every key block
    dq_regs: bool = False
    # sm90 family, calls of head dim 64 or 128 without softcapping, dense or packed documents (the
    # module's WS_BWD): the
    # dK/dV pass is the Gluon kernel _attn_bwd_dkdv_ws -- one producer warp streams Q / dO blocks
    # of block_m rows through a ring of num_stages slots, `consumers` warp groups (num_warps = 4
    # each) own block_n // consumers keys each. 0: the Triton kernel
    consumers: int = 0
    # the same for the dQ pass (_attn_bwd_dq_ws): the producer warp streams K / V blocks of
    # dq_block_n keys, `dq_consumers` warp groups own dq_block_m // dq_consumers query rows each
    dq_consumers: int = 0
    # the Gluon dK/dV pass (consumers = 2): both consumer warp groups own all block_n keys and split
    # each query block's work by role -- one computes P^T and dV, the other dP^T, dS^T and dK, P^T
    # handed over through shared memory -- instead of block_n // 2 keys each with both
    # accumulators. One fp32 accumulator per consumer, so hd256 fits (hd192, two column tiles in
    # this family: two accumulators of 128 and 64 columns)
    roles: bool = False

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def ws_backward(spec: KernelSpec) -> bool:
    """The backward gets the warp-specialized Gluon passes (templates/_bwd_ws_dkdv.py.jinja and
    _bwd_ws_dq.py.jinja, BwdConfig.consumers / dq_consumers): sm90 family, dense calls and packed
    documents, no softcapping, the same head dim for Q, K and V, one of WS_BWD_HEAD_DIMS (its dK and dV
    accumulators live in the consumers' registers: 64 keys x the head dim, twice up to hd128, once
    per consumer past it, BwdConfig.roles; the dQ pass holds Q and dO in registers, up to hd128).
    Expression kernels (mask and score expressions, sinks) take them too; the dQ
    pass only where it has no gradients of its own to sum (ws_dq_takes)."""
    return (spec.family == "bwd" and spec.target == "sm90" and not spec.softcap
            and spec.head_dim_qk == spec.head_dim_v and spec.head_dim_qk in WS_BWD_HEAD_DIMS)


def ws_dq_takes(spec: KernelSpec) -> bool:
    """The Gluon dQ pass computes dQ only: learnable parameters' partial sums and the sinks' exact
    D (grad_terms, exact_d) stay in the Triton dQ pass."""
    return not (grad_terms(spec) or exact_d(spec))


# The Gluon passes' head dims. 80, 96 and 192 run as two column tiles (64 + 16, 64 + 32, 128 + 64:
# a matmul over the head dim chains one wgmma per tile, an accumulator over it is one per tile);
# the dQ pass holds Q and dO in registers up to hd128, reads them from shared memory at hd192, and
# does not fit shared memory at hd256 (check_ws_bwd)
WS_BWD_HEAD_DIMS = (64, 80, 96, 128, 192, 256)



def pointer_bwd_config(cfg: "BwdConfig") -> "BwdConfig":
    """The backward's twin of pointer_fwd_config: the pointer passes' config for `cfg` (the Gluon
    passes' tiles through bwd_triton_fallback; tma, split_dkdv, dq_regs off)."""
    cfg = bwd_triton_fallback(cfg)
    return dataclasses.replace(cfg, tma=False, split_dkdv=False, dq_regs=False)



def bwd_smem_bytes(spec: KernelSpec, cfg: BwdConfig) -> tuple[int, int]:
    """(dK/dV kernel, dQ kernel) shared-memory need, 2-byte tiles. dK/dV: its K and V tiles once,
    Q and dO tiles per stage, fp32 LSE and delta rows per extra stage, and with atomic_dq the fp32
    dQ tile (a lower bound there: Triton may stage more; what still does not fit is a failed
    trial, h200_ab_bwd_configs_2026-11-30.json); dQ: its Q and dO tiles once,
    K and V tiles per stage. Both match Triton 3.6 on the H200 split sweep to the byte (dK/dV
    128x128 s3: 264192; dQ 128x128 s3: 262144; h200_sweep_split_2026-11-30.json)."""
    dqk = sum(w for _, w in spec.head_chunks("qk"))
    d = dqk + sum(w for _, w in spec.head_chunks("v"))
    dkdv = 2 * d * (cfg.block_n + cfg.num_stages * cfg.block_m) + 8 * (cfg.num_stages - 1) * cfg.block_m
    if cfg.atomic_dq:  # the fp32 dQ tile goes through shared memory (hd256 64x64 s2: 263168, H200)
        dkdv += 4 * cfg.block_m * dqk
    if cfg.roles:  # the fp32 P^T tile one consumer hands the other
        dkdv += 4 * cfg.block_n * cfg.block_m
    dq = 2 * d * (cfg.dq_block_m + cfg.dq_num_stages * cfg.dq_block_n)
    return dkdv, dq


# the backward's consumers (dK/dV: two fp32 accumulators of 64 keys x hd128; dQ: one, with Q and dO
# in registers): 240 each, the producer 24 -- the register file of 12 warps at WS_MAXNREG
WS_BWD_CONSUMER_REGS = 240


def check_ws_bwd(spec: KernelSpec, cfg: BwdConfig) -> str | None:
    """The warp-specialized Gluon passes' own constraints (cfg.consumers, cfg.dq_consumers > 0)."""
    if not ws_backward(spec):
        return ("consumers / dq_consumers (the warp-specialized Gluon backward) exist for sm90 calls "
                f"of head dim {', '.join(map(str, WS_BWD_HEAD_DIMS))} (Q, K and V alike) without softcapping only")
    if cfg.consumers not in (0, 2) or cfg.dq_consumers not in (0, 2):
        return "consumers / dq_consumers are 0 (the Triton kernels) or 2 (two consumer warp groups)"
    if not cfg.tma or cfg.atomic_dq:
        return "consumers / dq_consumers need tma and a dQ pass of its own (not atomic_dq)"
    wide = max(spec.head_dim_qk, spec.head_dim_v) > 128
    if spec.varlen and len(spec.head_chunks("qk")) > 1:
        # one forced GPU grid case failed there (hd96, packed documents, split roles beside the
        # Gluon dQ pass, H100, 2026-12-06; its log did not come back) while the dense ones passed
        return ("consumers / dq_consumers: packed documents at a two-tile head dim (80, 96, 192) keep the "
                "Triton passes (a GPU correctness case failed there, not yet understood)")
    if cfg.consumers:
        if cfg.split_dkdv:
            return "consumers: the Gluon dK/dV pass computes dK and dV in one launch (no split_dkdv)"
        if wide and not cfg.roles:
            return ("consumers: past head dim 128 the Gluon dK/dV pass needs roles (one accumulator per "
                    "consumer; dK and dV of 64 keys do not fit one warp group's registers)")
        if cfg.roles and (cfg.block_n != 64 or cfg.num_warps != 4):
            return "roles: both consumers own the program's 64 keys (block_n = 64, num_warps = 4)"
        if not cfg.roles and (cfg.block_n != 64 * cfg.consumers or cfg.num_warps != 4):
            return "consumers: each consumer is one warp group of 64 keys (block_n = 64 x consumers, num_warps = 4)"
        if cfg.block_m != 64 and not (cfg.block_m == 128 and max(spec.head_dim_qk, spec.head_dim_v) <= 64):
            return ("consumers: block_m (the query rows of one ring slot) is 64, or 128 up to head dim 64 "
                    "(wider tiles spill)")
    if cfg.dq_consumers and not ws_dq_takes(spec):
        return ("dq_consumers: the Gluon dQ pass sums no gradients of learnable parameters or sinks "
                "(the Triton dQ pass does)")
    if cfg.dq_consumers and max(spec.head_dim_qk, spec.head_dim_v) > 192:
        return ("dq_consumers: the Gluon dQ pass's Q, dO and K / V ring do not fit shared memory past "
                "head dim 192 (hd256 keeps the Triton dQ pass)")
    if cfg.dq_consumers:
        if cfg.dq_block_m != 64 * cfg.dq_consumers or cfg.dq_num_warps != 4:
            return ("dq_consumers: each consumer is one warp group of 64 query rows "
                    "(dq_block_m = 64 x dq_consumers, dq_num_warps = 4)")
        if cfg.dq_block_n != 64 or cfg.dq_regs:
            return "dq_consumers: dq_block_n is 64 (Q and dO are held in registers already: no dq_regs)"
        if cfg.dq_num_stages < 2:
            # a consumer holds two ring slots at once (block j's K / V for its scores, block j-1's
            # K for the dQ update in flight) and frees the older one after waiting for the newer:
            # with one slot the producer waits for a release that waits for the producer (the H200
            # tuner hung on this config, 2026-12-04)
            return ("dq_consumers: dq_num_stages is at least 2 (the Gluon dQ pass holds block j's and "
                    "block j-1's K / V slots at once)")
    return None


def bwd_triton_fallback(cfg: BwdConfig, dkdv: bool = True, dq: bool = True) -> BwdConfig:
    """The Triton kernels' config for a call the warp-specialized passes cannot take (a CPU
    tensor, rows the copy engine cannot address): the dK/dV pass (dkdv) with one consumer's keys per
    program (with roles: dK and dV from two launches of 32-query steps, one accumulator each, the
    hd256 Triton default), the dQ pass (dq) with 128-row 8-warp programs, the tiles otherwise kept
    (the Gluon pass's 128-row ring slots at hd64 become the Triton pass's 64-query steps)."""
    if dkdv and cfg.consumers and cfg.roles:  # one accumulator per launch, as roles has per consumer
        cfg = dataclasses.replace(cfg, consumers=0, roles=False, block_m=32, split_dkdv=True)
    elif dkdv and cfg.consumers:
        cfg = dataclasses.replace(cfg, consumers=0, block_m=min(cfg.block_m, 64),
                                  block_n=cfg.block_n // cfg.consumers)
    if dq and cfg.dq_consumers:
        cfg = dataclasses.replace(cfg, dq_consumers=0, dq_block_m=128, dq_num_warps=8)
    return cfg


def host_descriptor_bwd(cfg: BwdConfig, spec: KernelSpec) -> BwdConfig:
    """The config for a call run with ATTNGEN_KERNEL_DESCRIPTORS=0: packed documents leave the
    Gluon passes (the only backward kernels of a default config that make TMA descriptors in the
    kernel, one per document) for the Triton passes and their default tiles; dense calls keep
    theirs (host descriptors only)."""
    if not spec.varlen or not (cfg.consumers or cfg.dq_consumers):
        return cfg
    return bwd_triton_fallback(cfg)


def check_bwd(spec: KernelSpec, cfg: BwdConfig) -> str | None:
    """None if `cfg` can launch `spec`'s backward kernels, else the reason (the tuner records it)."""
    for part, bm, bn, warps, stages in (
            ("dK/dV", cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages),
            ("dQ", cfg.dq_block_m, cfg.dq_block_n, cfg.dq_num_warps, cfg.dq_num_stages)):
        if not (_pow2(bm) and _pow2(bn)):
            return f"{part}: block sizes must be powers of two"
        if bm < 16 or bn < 16:
            return f"{part}: block sizes below 16 do not map onto tensor-core tiles"
        if warps not in (1, 2, 4, 8, 16):
            return f"{part}: num_warps must be 1, 2, 4, 8 or 16"
        if stages < 1:
            return f"{part}: num_stages must be >= 1"
    if cfg.tma and spec.target != "sm90":
        return "tma exists in the sm90 family's backward only"
    if cfg.dq_regs and not (cfg.tma and not cfg.atomic_dq):
        return "dq_regs exists in the sm90 family's TMA dQ pass only (needs tma, not atomic_dq)"
    if cfg.split_dkdv and not cfg.tma:
        return "split_dkdv exists in the sm90 family's TMA dK/dV kernel only (needs tma)"
    if cfg.roles and not cfg.consumers:
        return "roles splits the Gluon dK/dV pass's work between its consumers (needs consumers = 2)"
    if cfg.consumers or cfg.dq_consumers:
        why = check_ws_bwd(spec, cfg)
        if why:
            return why
    have = SMEM_LIMIT.get(spec.target, SMEM_LIMIT["sm80"])
    for part, need in zip(("dK/dV", "dQ"), bwd_smem_bytes(spec, cfg)):
        if need > have:
            return f"{part}: needs ~{need} B of shared memory, {spec.target} has {have}"
    return None


SPACE: dict[str, tuple] = {
    "block_m": (32, 64, 128),
    "block_n": (64, 128),
    "num_warps": (4, 8),
    "num_stages": (1, 2, 3),
    "dq_block_m": (64, 128),
    "dq_block_n": (32, 64),
    "dq_num_warps": (4, 8),
    "dq_num_stages": (1, 2, 3),
    "atomic_dq": (False, True),
}
# the Gluon passes' knobs (consumers, dq_consumers, roles) are in the sm90 space: they are its
# defaults, so the tuner measures them beside the Triton kernels (check_ws_bwd drops the
# combinations that cannot launch before any compile)
TARGET_SPACES: dict[str, dict[str, tuple]] = {
    "sm90": {"consumers": (0, 2), "dq_consumers": (0, 2), "roles": (False, True), "tma": (False, True),
             "split_dkdv": (False, True)},
}


# The warp-specialized Gluon backward where it exists (dense hd64 / hd128 without softcapping): the
# dK/dV pass with 128 keys per program over two consumer warp groups, 64-query ring slots; the dQ
# pass with 128 query rows over two consumers, 64-key blocks, 3 stages. H200, bf16, backward-only
# TFLOP/s beside the Triton kernels' defaults in one run (benchmarks/tools/bwd_ab.py,
# h200_ab_ws_bwd2_2026-12-01.json): causal B4 H16 S4096 357 -> 385 (dK/dV only) -> 392 (both),
# full 412 -> 463 -> 473, GQA 32/8 causal S8192 362 -> 395 -> 431, window 1024 GQA 263 -> 341 ->
# 386; hd64 causal 328 -> 368 with the Gluon dK/dV pass, 353 with both (its dQ pass stays Triton's)
WS_BWD_DEFAULT = BwdConfig(64, 128, 4, 2, 128, 64, 4, 3, tma=True, consumers=2, dq_consumers=2)
# hd64: the Gluon dK/dV pass with 128 query rows per ring slot (m64n128 wgmmas for S^T and dP^T,
# half the ring turns of 64-row slots). H100, backward only, causal B4 H32 S4096 hd64, three rounds
# in one process beside the 64-row form (benchmarks/ab/h100_ab_bwd_hd64_m128_2026-12-07.json):
# 2.01 -> 1.89 ms (342 -> 364 TFLOP/s), the dK/dV kernel 1175 -> 1040 us; 168 registers, a 2-byte
# spill. The Gluon dQ pass beside it loses (768 vs 681 us for the Triton TMA dQ pass)
WS_BWD_DEFAULT_HD64 = BwdConfig(128, 128, 4, 2, 128, 64, 8, 3, tma=True, consumers=2)
# the 64-row form it replaced (the GPU grid's bwd:gluon-dkdv path, which hd128 takes too)
WS_BWD_DKDV_M64 = BwdConfig(64, 128, 4, 2, 128, 64, 8, 3, tma=True, consumers=2)
# hd256: the Gluon dK/dV pass with split roles (64 keys per program, one consumer computing P^T and
# dV, the other dP^T, dS^T and dK) and the Triton TMA dQ pass: causal B2 H16 S4096 377 vs 247
# TFLOP/s backward-only for the split Triton dK / dV launches; on hd128 roles lose to the default
# (causal 368 vs 448, GQA 32/8 399 vs 429; h200_ab_bwd_roles_2026-12-01.json)
WS_BWD_ROLES = BwdConfig(64, 64, 4, 2, 64, 64, 4, 2, tma=True, consumers=2, roles=True)
# hd192: split roles beside the Gluon dQ pass (two consumers of 64 query rows, Q and dO read from
# shared memory; hd256's dQ tiles do not fit it). H100, causal B4 H16 S4096, backward only, against
# the Triton TMA passes it replaced (split dK / dV), two rounds alternated in one process: 2.87 / 3.04
# ms (339 TFLOP/s) against 4.18 / 4.13 ms (246), 1.37x; per kernel, dK/dV 1602 vs 2403 us and dQ
# 1189 vs 1543 (benchmarks/ab/h100_ab_bwd_hd192_2026-12-07.json). The bench row after it: fwd+bwd
# 386 TFLOP/s, 1.13x cuDNN (benchmarks/results/h100_bench_hd192_2026-12-07.json)
WS_BWD_ROLES_DQ = dataclasses.replace(WS_BWD_ROLES, dq_block_m=128, dq_consumers=2)

# The two-tile head dims whose default is the Gluon passes (two consumers over 128 keys and the
# Gluon dQ pass at hd80 / hd96, split roles beside the Gluon dQ pass at hd192). H100, backward only,
# causal B4 H32 S4096, against the Triton TMA passes in one process, two rounds alternated
# (benchmarks/ab/h100_ab_bwd_two_tile_2026-12-07.json): hd96 331 -> 380 TFLOP/s, hd80 273 -> 356.
# Packed documents keep the Triton passes there (check_ws_bwd). hd192 takes WS_BWD_ROLES_DQ since
# session 58 (its A/B above it)
WS_BWD_TWO_TILE_DEFAULT = (80, 96, 192)

SHORT_WINDOW = 2048  # keys a query sees, at most, for the window backward's short-window tiles
# Expression kernels' defaults on the Gluon passes. H100, forward+backward ms beside the Triton
# defaults, one process (benchmarks/ab/h100_ab_expr_gluon_2026-12-06.jsonl, by
# benchmarks/tools/expr_config_sweep.py, removed since: git show 6aeaf2f:<that path>): ALiBi
# causal 8k hd128 5.41 -> 4.56 (Flex 5.26), the forward alone 1.25 -> 1.18 (Flex 1.59); eight
# documents 8k GQA 32/8 1.06 -> 0.81 (Flex 0.98).
# The backward's sweep (benchmarks/ab/h100_ab_expr_bwd_sweep_2026-12-06.jsonl): short reaches
# too, document ids + 512-key window 0.997 (Triton, 32-query steps) -> 0.825 (Flex 1.035), and
# hd256 with split roles, prefix-LM 10.02 (split Triton passes) -> 6.62 (Flex 12.23). Off (False)
# keeps the Triton kernels.
WS_EXPR_DEFAULT = True
# head dims whose expression kernels default to the Gluon forward: those measured (hd64, hd128;
# hd256's forced GPU runs pass, its forward's speed with expressions is not measured). The
# backward takes every head dim of WS_BWD_HEAD_DIMS
WS_EXPR_MAX_HD = 128


def expr_short_reach(spec: KernelSpec) -> bool:
    """A mask expression that keeps each query's keys within SHORT_WINDOW (key_reach)."""
    node = mask_node(spec)
    reach = None if node is None else key_reach(node)
    return reach is not None and reach < SHORT_WINDOW


def default_bwd_config(spec: KernelSpec, device_kind: str = "cuda", window: int | None = None) -> BwdConfig:
    """The backward's config: the Gluon passes where they exist (sm90), else the Triton passes'
    tables. `window`: the keys one query sees at most under a sliding-window mask (None: not
    known, as for the tuner's baseline). Measurements: docs/defaults.md."""
    d = max(spec.head_dim_qk, spec.head_dim_v)
    if device_kind == "cpu":
        return BwdConfig(32, 64, 4, 1, 64, 32, 4, 1)
    tma = spec.target == "sm90"
    short = expr_short_reach(spec)
    two_tile = len(spec.head_chunks("qk")) > 1
    # hd192's expression kernels keep the Triton passes: the Gluon ones are GPU-tested there on
    # built-in masks only (tests/gpu/test_gpu_grid.py)
    gluon_two_tile = d in WS_BWD_TWO_TILE_DEFAULT and not (d == 192 and spec.has_expr)
    if tma and not (spec.has_expr and not WS_EXPR_DEFAULT) and (gluon_two_tile or not two_tile):
        ws = (WS_BWD_ROLES if d > 192 else WS_BWD_ROLES_DQ if d > 128 else WS_BWD_DEFAULT if d > 64
              else WS_BWD_DEFAULT_HD64)
        if spec.has_expr and not ws_dq_takes(spec):
            ws = bwd_triton_fallback(ws, dkdv=False, dq=True)  # gradients of parameters / sinks
        if check_bwd(spec, ws) is None:
            return ws
    if tma and spec.has_expr:
        # expression kernels where the Gluon passes do not take the call (softcapping, hd192,
        # WS_EXPR_DEFAULT off). H100, forward+backward ms, the default below ->
        # these (benchmarks/ab/h100_ab_expr_config_sweep_2026-12-06.jsonl, then
        # h100_bench_mods_exprdefaults_2026-12-06.json): hd256 prefix-LM, split passes with
        # 128-key blocks, 10.92 -> 9.96; hd <= 128 with a mask that keeps each query's keys within
        # a short reach (a window), 32-query steps in the dK/dV pass, as for built-in short
        # windows: document ids + 512-key window 2.03 -> 1.32. Longer reaches keep 64-query steps
        # (Llama 4's 8192-key chunks: 22.4 with them, 24.4 with 32)
        if d > 128:
            return BwdConfig(32, 128, 8, 2, 64, 64, 4, 2, tma=True, split_dkdv=True)
        if short:
            return BwdConfig(32, 64, 4, 2, 128, 64, 8, 3, tma=True)
    if d <= 128:  # dK/dV and dQ swept separately (h200_sweep_split_2026-11-30.json)
        if spec.mask == "sliding_window" and window is not None and window <= SHORT_WINDOW:
            # 32-query steps in the dK/dV pass waste less on a short window's two masked edges: a
            # 1024-key window, GQA 32/8, S8192: 284 vs 259-262 TFLOP/s backward-only; with 4096 keys
            # the edges matter less and they lose (340 vs 353), as on plain causal (341 vs 348)
            # (h200_ab_bwd_window_2026-12-01.json, h200_ab_bwd_window4096_2026-12-01.json)
            return BwdConfig(32, 64, 4, 2, 128, 64, 8, 3, tma=tma)
        if tma and 80 < d < 128:
            # the TMA dQ pass on 64x64 tiles with 4 warps: hd96 causal 348 vs 318 TFLOP/s
            # backward-only; on hd128 a tie (366 vs 366 causal, 419 vs 418 full, 368 vs 360 GQA),
            # so hd128 keeps its tuned table; hd80 not measured (h200_ab_bwd_dq_warps_2026-12-01.json)
            return BwdConfig(64, 64, 4, 2, 64, 64, 4, 2, tma=True)
        return BwdConfig(64, 64, 4, 2, 128, 64, 8, 3, tma=tma)
    # hd256 (measurements: docs/defaults.md): split dK / dV launches of 32 x 64 tiles on sm90
    if tma:
        return BwdConfig(32, 64, 4, 2, 64, 64, 4, 2, tma=True, split_dkdv=True)
    # the sm80 family: the best of the hd256 sweep that fits an sm80 GPU's 163 KB of shared memory,
    # 159 TFLOP/s backward-only (64x64 8 warps 2 stages gave 173 on the H200 but needs 193 KB)
    return BwdConfig(64, 32, 4, 1, 64, 32, 4, 1)
