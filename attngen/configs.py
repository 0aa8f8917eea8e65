"""Launch configurations: frozen dataclasses, one validity filter, and the default tables.

Shared by the runtime (defaults) and the tuner (search spaces, check_fwd / check_bwd). No
optional dependencies.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

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
    # this family, keeps the Triton passes)
    roles: bool = False

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


# Shared memory per block, bytes (the opt-in limit).
SMEM_LIMIT = {"sm80": 163 * 1024, "sm90": 227 * 1024}


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
    """The forward gets the warp-specialized Gluon kernel (templates/_mainloop_ws.py.jinja for dense
    calls, _mainloop_ws_docs.py.jinja for packed documents; FwdConfig.consumers): sm90 family, no
    softcapping, the same
    head dim for Q, K and V, one of WS_HEAD_DIMS (192 runs as two column tiles, 128 + 64;
    softcapping and the other head dims keep the Triton kernels)."""
    return _ws_kernel(spec, "fwd", WS_HEAD_DIMS)


WS_HEAD_DIMS = (64, 128, 192, 256)


def ws_backward(spec: KernelSpec) -> bool:
    """The backward gets the warp-specialized Gluon passes (templates/_bwd_ws_dkdv.py.jinja and
    _bwd_ws_dq.py.jinja, BwdConfig.consumers / dq_consumers): sm90 family, dense calls and packed documents, no
    softcapping, the same head dim for Q, K and V, one of WS_BWD_HEAD_DIMS (its dK and dV
    accumulators live in the consumers' registers: 64 keys x the head dim, twice up to hd128, once
    per consumer past it, BwdConfig.roles; the dQ pass holds Q and dO in registers, up to hd128)."""
    return _ws_kernel(spec, "bwd", WS_BWD_HEAD_DIMS)


# hd192 is two column tiles (128 + 64) in this family; the Gluon backward takes one tile per
# operand, so it keeps the Triton passes
WS_BWD_HEAD_DIMS = (64, 128, 256)


def _ws_kernel(spec: KernelSpec, family: str, head_dims: tuple) -> bool:
    """A Gluon kernel of `family` exists for `spec`: sm90, no softcapping, one head dim for Q, K
    and V among `head_dims`."""
    return (spec.family == family and spec.target == "sm90" and not spec.softcap
            and spec.head_dim_qk == spec.head_dim_v and spec.head_dim_qk in head_dims)


WS_MAXNREG = 168  # the warp-specialized forward's register cap: 12 warps (3 warp groups) fit an SM
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


def pointer_bwd_config(cfg: "BwdConfig") -> "BwdConfig":
    """The backward's twin of pointer_fwd_config: the pointer passes' config for `cfg` (the Gluon
    passes' tiles through bwd_triton_fallback; tma, split_dkdv, dq_regs off)."""
    cfg = bwd_triton_fallback(cfg)
    return dataclasses.replace(cfg, tma=False, split_dkdv=False, dq_regs=False)


class InvalidConfig(ValueError):
    """A config that the validity filter rejects reached a launch."""


def require_valid(spec: KernelSpec, cfg, check) -> None:
    """The launchers' choke point: every config that reaches a launch passes the validity filter
    the tuner uses (`check`: check_fwd / check_bwd), whatever path (tuned winner, default table,
    forced config, a plan's downgrade or a launcher's fallback) produced it."""
    why = check(spec, cfg)
    if why is not None:
        raise InvalidConfig(f"{spec.uri}: config {cfg} is rejected by the validity filter ({why}); "
                            "it cannot be launched")


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
        if cfg.block_m != 64:
            return "consumers: block_m (the query rows of one ring slot) is 64"
    if cfg.dq_consumers and wide:
        return ("dq_consumers: the Gluon dQ pass holds Q and dO in registers, up to head dim 128 "
                "(wider ones keep the Triton dQ pass)")
    if cfg.dq_consumers:
        if cfg.dq_block_m != 64 * cfg.dq_consumers or cfg.dq_num_warps != 4:
            return ("dq_consumers: each consumer is one warp group of 64 query rows "
                    "(dq_block_m = 64 x dq_consumers, dq_num_warps = 4)")
        if cfg.dq_block_n != 64 or cfg.dq_regs:
            return "dq_consumers: dq_block_n is 64 (Q and dO are held in registers already: no dq_regs)"
    return None


def bwd_triton_fallback(cfg: BwdConfig, dkdv: bool = True, dq: bool = True) -> BwdConfig:
    """The Triton kernels' config for a call the warp-specialized passes cannot take (a CPU
    tensor, rows the copy engine cannot address): the dK/dV pass (dkdv) with one consumer's keys per
    program (with roles: dK and dV from two launches of 32-query steps, one accumulator each, the
    hd256 Triton default), the dQ pass (dq) with 128-row 8-warp programs, the tiles otherwise kept."""
    if dkdv and cfg.consumers and cfg.roles:  # one accumulator per launch, as roles has per consumer
        cfg = dataclasses.replace(cfg, consumers=0, roles=False, block_m=32, split_dkdv=True)
    elif dkdv and cfg.consumers:
        cfg = dataclasses.replace(cfg, consumers=0, block_n=cfg.block_n // cfg.consumers)
    if dq and cfg.dq_consumers:
        cfg = dataclasses.replace(cfg, dq_consumers=0, dq_block_m=128, dq_num_warps=8)
    return cfg


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


# Search spaces: candidate values per config field. The tuner builds its space from
# dataclasses.fields(config class): a field listed here is searched over its candidates, a field
# not listed keeps its dataclass default (so a new field with a default plugs in untuned until its
# candidates are added here). TARGET_SPACES adds or overrides candidates per kernel target.
FWD_SPACE: dict[str, tuple] = {
    "block_m": (64, 128),
    "block_n": (32, 64, 128),
    "num_warps": (4, 8),
    "num_stages": (1, 2, 3, 4),
    "lazy_rescale": (False, True),
}
BWD_SPACE: dict[str, tuple] = {
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
TARGET_SPACES: dict[tuple[str, str], dict[str, tuple]] = {  # (family, target) -> candidates
    # warp_specialize stays a knob but out of the default search: it lost on every H200 probe case.
    # The Gluon kernels' knobs (consumers, pair_tiles; consumers, dq_consumers, roles) are in it:
    # those kernels are the sm90 defaults, so the tuner measures them beside the Triton kernels
    # (check_ws / check_ws_bwd drop their combinations that cannot launch before any compile)
    ("fwd", "sm90"): {"consumers": (0, 1, 2), "tma": (False, True), "pair_tiles": (False, True),
                      "q_regs": (False, True)},
    ("bwd", "sm90"): {"consumers": (0, 2), "dq_consumers": (0, 2), "roles": (False, True),
                      "tma": (False, True), "split_dkdv": (False, True)},
}
SPACES = {"fwd": FWD_SPACE, "bwd": BWD_SPACE}
# The order in which TPE's walk (tuning/sampling.py) picks fields: the knobs that choose a kernel
# first (TARGET_SPACES, in its order, then these), since they fix or rule out values of the others;
# the remaining fields in config order.
KERNEL_KNOBS = ("atomic_dq", "warp_specialize", "persistent", "lazy_rescale")


def search_order(family: str, target: str, names: list[str]) -> list[str]:
    """`names` (a space's fields) in the order TPE's walk picks them."""
    first = [n for n in (*TARGET_SPACES.get((family, target), {}), *KERNEL_KNOBS) if n in names]
    return first + [n for n in names if n not in first]


def search_space(config_cls: type, family: str, target: str) -> dict[str, tuple]:
    """Every field of `config_cls` (the family's config class, attngen.families) -> its candidate
    values, in field order."""
    cands = {**SPACES.get(family, {}), **TARGET_SPACES.get((family, target), {})}
    out = {}
    for f in dataclasses.fields(config_cls):
        if f.name in cands:
            out[f.name] = tuple(cands[f.name])
        elif f.default is not dataclasses.MISSING:
            out[f.name] = (f.default,)
        else:
            raise ValueError(f"{config_cls.__name__}.{f.name}: no candidate values in the {family} "
                             f"search space and no default (add it to {family.upper()}_SPACE)")
    unknown = set(cands) - set(out)
    if unknown:
        raise ValueError(f"{family} search space names fields {config_cls.__name__} does not have: "
                         f"{', '.join(sorted(unknown))}")
    return out


def config_from_dict(config_cls: type, values: dict):
    """A config object from a field -> value dict; fields left out take their defaults. A
    ValueError names unknown or missing fields (a stored config of another config layout)."""
    names = {f.name for f in dataclasses.fields(config_cls)}
    unknown = set(values) - names
    if unknown:
        raise ValueError(f"{config_cls.__name__} has no field(s) {', '.join(sorted(unknown))}")
    try:
        return config_cls(**values)
    except TypeError as exc:
        raise ValueError(f"{config_cls.__name__}: {exc}") from None


def enumerate_space(config_cls: type, family: str, spec: KernelSpec, check) -> list[tuple[object, str | None]]:
    """Every config of the search space with check(spec, cfg) (None = valid), in grid order."""
    space = search_space(config_cls, family, spec.target)
    out = []
    for values in itertools.product(*space.values()):
        cfg = config_cls(**dict(zip(space, values)))
        out.append((cfg, check(spec, cfg)))
    return out


def default_fwd_config(spec: KernelSpec, device_kind: str = "cuda", seqlen_q: int = 0) -> FwdConfig:
    """Defaults per head dim, the best of the H200 config sweep (benchmarks/results/
    h200_sweep_2026-11-30.json; that sweep is `attngen tune --sampler grid` now); the interpreter
    gets big tiles because its cost is per tile operation."""
    d = max(spec.head_dim_qk, spec.head_dim_v)
    if device_kind == "cpu":
        return FwdConfig(64, 64, 4, 1)
    if spec.target == "sm90":
        ws = WS_DEFAULT if d <= 128 else WS_DEFAULT_WIDE
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
# kernel's default and cuDNN in one run (benchmarks/tools/gluon_fwd.py, h200_gluon_fwd_2026-12-01.json):
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
    """The sm90 family's dense forward, from the H200 config A/B (bf16 TFLOP/s, same run;
    benchmarks/results/h200_ab_configs_2026-11-30.json): 64x64 TMA tiles with 3 stages won on every
    hd128 case (full 532 vs 500 for the pointer kernel's 128x64; causal S4096 470; causal S16384
    513; GQA 491, 503 with lazy rescaling; a 1024-key window 433) and hd64 (404); the split head
    dims want longer query tiles or fewer stages: hd80 (64 + 16) 64x64 2 stages 410, hd96 (64 + 32)
    128x64 439, hd192 (128 + 64) 128x64 473; hd256 64x64 with lazy rescaling 465 (445 without).
    Warp specialization lost everywhere (h200_hopper_probe_2026-11-30.json) and is not a default.
    The Q tile in registers (q_regs) then won on the 64x64 tiles up to hd128, two runs
    (h200_ab_fwd_qregs_2026-12-01.json, h200_ab_fwd_qregs2_2026-12-01.json): full 493 -> 508 and
    513 -> 556, causal S4096 482 -> 506 and 486 -> 488, causal S16384 486 -> 516 and 496 -> 533,
    GQA 510 -> 525 and 510 -> 538, window 435 -> 443 and 435 -> 445, hd64 389 -> 431 and 403 -> 422;
    hd96 on 64x64 tiles with it 457 vs 438 for 128x64; it lost on hd80 (399 vs 407), hd256 (314 vs
    467: spills), hd192 (471 vs 473) and on packed documents (8 x 1024: 339 vs 347; uneven 387 vs
    398). Three programs per SM (2 stages and maxnreg=168, or 64x32 tiles) lost everywhere.
    Packed documents take the same table otherwise: on 8 causal 1024-token documents (GQA 32/8,
    hd128) the TMA kernel's 64x64 3 stages gave 355 TFLOP/s vs 300 for the pointer kernel's default
    (347 with the documents isolated, h200_ab_varlen_guard_2026-12-01.json), and on 8 uneven
    documents 398 vs 339; 2 or 4 stages, 128-row or 128-key tiles, 8 warps and persistent
    programs were slower (h200_ab_varlen_2026-12-01.json, h200_ab_varlen_fwd_2026-12-01.json)."""
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


# The warp-specialized Gluon backward where it exists (dense hd64 / hd128 without softcapping): the
# dK/dV pass with 128 keys per program over two consumer warp groups, 64-query ring slots; the dQ
# pass with 128 query rows over two consumers, 64-key blocks, 3 stages. H200, bf16, backward-only
# TFLOP/s beside the Triton kernels' defaults in one run (benchmarks/tools/bwd_ab.py,
# h200_ab_ws_bwd2_2026-12-01.json): causal B4 H16 S4096 357 -> 385 (dK/dV only) -> 392 (both),
# full 412 -> 463 -> 473, GQA 32/8 causal S8192 362 -> 395 -> 431, window 1024 GQA 263 -> 341 ->
# 386; hd64 causal 328 -> 368 with the Gluon dK/dV pass, 353 with both (its dQ pass stays Triton's)
WS_BWD_DEFAULT = BwdConfig(64, 128, 4, 2, 128, 64, 4, 3, tma=True, consumers=2, dq_consumers=2)
WS_BWD_DEFAULT_HD64 = BwdConfig(64, 128, 4, 2, 128, 64, 8, 3, tma=True, consumers=2)
# hd256: the Gluon dK/dV pass with split roles (64 keys per program, one consumer computing P^T and
# dV, the other dP^T, dS^T and dK) and the Triton TMA dQ pass: causal B2 H16 S4096 377 vs 247
# TFLOP/s backward-only for the split Triton dK / dV launches; on hd128 roles lose to the default
# (causal 368 vs 448, GQA 32/8 399 vs 429; h200_ab_bwd_roles_2026-12-01.json)
WS_BWD_ROLES = BwdConfig(64, 64, 4, 2, 64, 64, 4, 2, tma=True, consumers=2, roles=True)

SHORT_WINDOW = 2048  # keys a query sees, at most, for the window backward's short-window tiles


def default_bwd_config(spec: KernelSpec, device_kind: str = "cuda", window: int | None = None) -> BwdConfig:
    """On the H200 sweep the separate dQ pass beat fp32 atomics (hd128 causal: 347 vs 302 TFLOP/s
    backward-only), so it is the default; atomic_dq stays a tunable knob. The sm90 family's dense
    calls take its TMA kernels, which won on every case of the H200 A/B with the same tiles
    (backward-only TFLOP/s, TMA vs pointer: hd128 causal 367 vs 309, full 402 vs 358, GQA 32/8
    362 vs 300, hd64 308 vs 302, hd96 312 vs 293, hd256 179 vs 159;
    benchmarks/results/h200_ab_bwd_tma_2026-11-30.json); packed documents too (8 causal 1024-token
    documents, GQA 32/8: 235 vs 178; 8 uneven documents: 274 vs 206; h200_ab_varlen_2026-12-01.json;
    with the documents isolated 202 and 240, h200_ab_varlen_guard_2026-12-01.json).
    `window`: the keys one query sees at most under a sliding-window mask (None: not known, as for
    the tuner's baseline)."""
    d = max(spec.head_dim_qk, spec.head_dim_v)
    if device_kind == "cpu":
        return BwdConfig(32, 64, 4, 1, 64, 32, 4, 1)
    tma = spec.target == "sm90"
    if tma:
        ws = WS_BWD_ROLES if d > 128 else WS_BWD_DEFAULT if d > 64 else WS_BWD_DEFAULT_HD64
        if check_bwd(spec, ws) is None:
            return ws
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
    # hd256: 173 TFLOP/s backward-only vs 69 for 32x64x4x1 (h200_sweep_hd256_2026-11-30.json). The
    # sm90 TMA kernels: dK and dV from two launches (split_dkdv) of 32x64 tiles and 4 warps, causal
    # hd256 199 vs 180 TFLOP/s for one 64x64 8-warp launch, hd192 207 vs 170 (spilled values in the
    # dK/dV kernel: one launch 138 / 78, split 12 + 0 / 0 + 0); 64x64 split 190 / 182, 8-warp split
    # 164 / 147, hd128 split 303 vs 369 (h200_ab_bwd_split_2026-12-01.json,
    # h200_ab_bwd_split2_2026-12-01.json). Its dQ pass on 64x64 tiles with 4 warps instead of 8:
    # hd256 247 vs 197, hd192 260 vs 213 TFLOP/s backward-only (128x32 8 warps 233 / 252, 64x32 4
    # warps 246 / 255; 32-query dQ tiles collapse to 17: h200_ab_bwd_split_dq_2026-12-01.json)
    if tma:
        return BwdConfig(32, 64, 4, 2, 64, 64, 4, 2, tma=True, split_dkdv=True)
    # the sm80 family: the best of the hd256 sweep that fits an sm80 GPU's 163 KB of shared memory,
    # 159 TFLOP/s backward-only (64x64 8 warps 2 stages gave 173 on the H200 but needs 193 KB)
    return BwdConfig(64, 32, 4, 1, 64, 32, 4, 1)
