"""The fp8 forward family's configs (attngen.families.fwd_fp8 has its launches): the launch config,
its validity filter and search space, the defaults of the Triton kernel and of the warp-specialized
Gluon one, which specs have the Gluon kernel, and the values the template needs (rotation blocks,
tiles)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from attngen.families.base import SMEM_LIMIT, WS_MAXNREG, _pow2, next_pow2
from attngen.spec import KernelSpec


SCALE_BLOCK = 128  # rows per quantization block (Q, K and V): a tile's BLOCK_M / BLOCK_N divide it
ROTATION_SEED = 0  # the default seed of the random signs
E4M3_MAX = 448.0


@dataclass(frozen=True)
class Fp8Config:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    # the fp8 dots' partial sums promoted to fp32 after every 32 products (max_num_imprecise_acc=32)
    # instead of summed at the tensor cores' reduced precision over the whole dot (Triton's sm90
    # default); either way the sum over key blocks is fp32
    precise_acc: bool = False
    # the warp-specialized Gluon kernel _attn_fwd_fp8_ws (ws_fp8 specs, dense calls on a GPU): 1 or
    # 2 consumer warp groups of 64 query rows (block_m = 64 x consumers, num_warps = 4), a ring of
    # num_stages K / V^T buffers filled by one producer warp (check_ws_fp8). 0: the Triton kernel
    consumers: int = 0

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def qk_width(spec: KernelSpec) -> int:
    """Head dim of the fp8 Q and K: head_dim_qk rounded up to 16 (rows 16-byte aligned)."""
    return -(-spec.head_dim_qk // 16) * 16


def rotation_blocks(width: int) -> tuple[tuple[int, int], ...]:
    """(offset, width) of the block-diagonal Hadamard over `width` columns (a multiple of 16): its
    binary decomposition, largest block first."""
    out, off = [], 0
    for b in range(width.bit_length() - 1, -1, -1):
        if width & (1 << b):
            out.append((off, 1 << b))
            off += 1 << b
    return tuple(out)


def _tile(width: int, used: int) -> dict:
    return {"sfx": "", "off": 0, "width": width, "used": used}


ROT_TILE = 64  # the prologue's rotation: column tiles of a wider Hadamard block (0: one dot a block)


def rotation_sums(r: int) -> list[list[tuple[int, int]]]:
    """For the r tiles of a Hadamard block H_r (x) H_t, output tile j' as (sign, j) terms of the
    tiles' products u_j with their diagonal blocks of diag(s) H (which carry H_r[j, j]):
    sign = H_r[j, j'] H_r[j, j] = (-1)^(popcount(j & j') + popcount(j))."""
    return [[(-1 if (bin(j & jo).count("1") + bin(j).count("1")) % 2 else 1, j) for j in range(r)]
            for jo in range(r)]


def context(spec: KernelSpec, rot_tile: int = ROT_TILE) -> dict:
    """What templates/attn_fwd_fp8.py.jinja reads beyond the common context."""
    w = qk_width(spec)
    blocks = rotation_blocks(w)
    return {
        "rot_tile": rot_tile,
        "rot_sums": {r: rotation_sums(r) for r in (1, 2, 4, 8, 16)},
        "qk_width": w,
        "rot_blocks": blocks,
        "quant_qk_blocks": [(off, bw, spec.head_dim_qk) for off, bw in blocks],
        "quant_v_blocks": [(0, max(16, next_pow2(spec.head_dim_v)), spec.head_dim_v)],
        # an fp8 dot steps 32 along its contraction: tiles at least 32 wide
        "fp8_qk_tiles": [_tile(max(32, next_pow2(w)), w)],
        "fp8_v_tiles": [_tile(max(32, next_pow2(spec.head_dim_v)), spec.head_dim_v)],
        "scale_block": SCALE_BLOCK,
        "ws_fp8": ws_fp8(spec),
    }


def smem_bytes(spec: KernelSpec, cfg: Fp8Config) -> int:
    """Shared memory of the pipelined K / V tiles (1-byte elements) and the Q tile."""
    ctx = context(spec)
    dq, dv = ctx["fp8_qk_tiles"][0]["width"], ctx["fp8_v_tiles"][0]["width"]
    return cfg.num_stages * cfg.block_n * (dq + dv) + cfg.block_m * dq


def check_fp8(spec: KernelSpec, cfg: Fp8Config) -> str | None:
    """None if `cfg` can launch `spec`'s fp8 kernels, else the reason (the tuner records it)."""
    if spec.family != "fwd_fp8":
        return f"an fp8 config cannot launch a {spec.family} kernel"
    for name in ("block_m", "block_n"):
        v = getattr(cfg, name)
        if not _pow2(v) or not 16 <= v <= SCALE_BLOCK:
            return f"{name} must be a power of two from 16 to {SCALE_BLOCK} (a tile reads one descale)"
    if cfg.precise_acc and cfg.block_n < 32:
        return "precise_acc promotes every 32 products: block_n must be at least 32"
    if cfg.num_warps not in (2, 4, 8):
        return "num_warps must be 2, 4 or 8"
    if not 1 <= cfg.num_stages <= 6:
        return "num_stages must be 1 to 6"
    if cfg.consumers:
        return check_ws_fp8(spec, cfg)
    need = smem_bytes(spec, cfg)
    if need > SMEM_LIMIT[spec.target]:
        return f"needs ~{need} B of shared memory (limit {SMEM_LIMIT[spec.target]})"
    return None


SPACE: dict[str, tuple] = {
    "block_m": (64, 128),
    "block_n": (32, 64, 128),
    "num_warps": (4, 8),
    "num_stages": (2, 3, 4),
    "precise_acc": (False, True),
    "consumers": (0, 1, 2),  # the Gluon kernel (check_ws_fp8 keeps its 64-row warp groups)
}


def default_fp8_config(spec: KernelSpec, device_kind: str = "cuda", seqlen_q: int = 0) -> Fp8Config:
    """The Gluon kernel where it exists and won (ws_fp8_preferred), else the Triton kernel's;
    seqlen_q: the call's query length (its bucket; 0: unknown) picks the Gluon kernel's tile."""
    if device_kind != "cpu" and ws_fp8_preferred(spec):
        return ws_fp8_default(spec, seqlen_q)
    return triton_fp8_config(spec, device_kind)


def variants(spec: KernelSpec) -> dict[str, bool]:
    """The optional kernels of `spec`'s module: the warp-specialized Gluon kernel."""
    return {"ws": ws_fp8(spec)}


# ------------------------------------------------------------------------------------------------
# the warp-specialized Gluon kernel (templates/_fp8_ws.py.jinja): which specs have it, its config
# check, its shared memory, its launch

WS_FP8_HEAD_DIMS = (64, 128, 256)  # qk_width and head_dim_v the Gluon kernel takes (one column tile)


def ws_fp8(spec: KernelSpec) -> bool:
    """The module gets `_attn_fwd_fp8_ws`: sm90, dense calls, no softcapping, qk_width and
    head_dim_v in WS_FP8_HEAD_DIMS (packed documents and softcapping keep the Triton kernel)."""
    return (spec.family == "fwd_fp8" and spec.target == "sm90" and not spec.softcap and not spec.varlen
            and qk_width(spec) in WS_FP8_HEAD_DIMS and spec.head_dim_v in WS_FP8_HEAD_DIMS)


# the Gluon kernel's configs: 128 query rows over two consumer warp groups, 128-key blocks in a
# 2-deep ring (hd256: 64-key blocks, 3 deep); up to WS_FP8_SHORT query rows (causal: up to
# WS_FP8_SHORT_CAUSAL) one consumer warp group of 64 rows a program, two programs an SM. H200,
# B1 H16 hd128, attention kernel alone, TFLOP/s, two consumers with a 2-deep ring / with a 3-deep
# one / one consumer (benchmarks/ab/h200_ab_fp8_configs_2026-12-04.json): S16k 807 / 806 / 799,
# causal 797 / 790 / 775; S8k 810 / 800 / 794; S4k 771 / 762 / 796; causal S8k 712 / 701 / 733,
# S4k 550 / 540 / 594, S2k 353 / 348 / 391. The first Gluon kernel's sweep: 64-key blocks at hd128
# 537 vs 670; hd256 858 (2 stages 834; Triton 367); hd64 371-376 vs the Triton kernel's 394, so
# hd64 keeps the Triton kernel by default
WS_FP8_DEFAULT = Fp8Config(128, 128, 4, 2, consumers=2)
WS_FP8_DEFAULT_WIDE = Fp8Config(128, 64, 4, 3, consumers=2)
WS_FP8_ONE = Fp8Config(64, 128, 4, 2, consumers=1)
WS_FP8_SHORT = 4096  # query rows up to which hd128 takes WS_FP8_ONE (no mask)
WS_FP8_SHORT_CAUSAL = 8192  # the same under a causal mask


def ws_fp8_preferred(spec: KernelSpec) -> bool:
    """The default config is the Gluon kernel's: ws_fp8 specs past hd64 (at hd64 the Triton kernel
    was faster)."""
    return ws_fp8(spec) and max(qk_width(spec), spec.head_dim_v) > 64


def ws_fp8_default(spec: KernelSpec, seqlen_q: int = 0) -> Fp8Config:
    """The Gluon kernel's config for `spec` (a ws_fp8 spec) at `seqlen_q` query rows (0: unknown):
    up to hd128, one consumer a program on short calls (no mask or causal; other masks were not
    measured), where two programs an SM overlap one's prologue and epilogue with the other's loop
    and the smaller tiles balance the SMs."""
    if max(qk_width(spec), spec.head_dim_v) > 128:
        return WS_FP8_DEFAULT_WIDE
    short = {"none": WS_FP8_SHORT, "causal": WS_FP8_SHORT_CAUSAL}.get(spec.mask, 0)
    return WS_FP8_ONE if 0 < seqlen_q <= short else WS_FP8_DEFAULT


def ws_smem_bytes(spec: KernelSpec, cfg: Fp8Config, rot: bool = False) -> int:
    """The Gluon kernel's shared memory: per consumer its Q8 rows (1 byte) and its O rows (2
    bytes: O cannot reuse the fp8 Q buffer), per ring stage a K8 and a V^T block (barriers aside);
    rot: Q quantized and rotated inside (ws_quant_q), the rotation's diagonal blocks (16-bit,
    qk_width x ROT_TILE; Q's 16-bit tiles go through O's buffer)."""
    w, dv = qk_width(spec), spec.head_dim_v
    extra = 2 * w * min(w, ROT_TILE) if rot else 0
    return cfg.block_m * (w + 2 * dv) + cfg.num_stages * cfg.block_n * (w + dv) + extra


def check_ws_fp8(spec: KernelSpec, cfg: Fp8Config) -> str | None:
    """The Gluon kernel's own constraints (cfg.consumers > 0)."""
    if not ws_fp8(spec):
        return ("consumers (the warp-specialized Gluon fp8 kernel) exists for sm90 dense calls without "
                f"softcapping whose qk width and v head dim are {' or '.join(map(str, WS_FP8_HEAD_DIMS))}")
    if cfg.consumers not in (1, 2):
        return "consumers is 0 (the Triton kernel), 1 or 2 (consumer warp groups per program)"
    if cfg.precise_acc:
        return "consumers: the Gluon kernel's wgmma chains have no fp32 promotion (precise_acc is the Triton kernel's)"
    if cfg.block_m != 64 * cfg.consumers or cfg.num_warps != 4:
        return "consumers: each consumer is one warp group of 64 query rows (block_m = 64 x consumers, num_warps = 4)"
    if cfg.block_n not in (64, 128):
        return "consumers: block_n is 64 or 128"
    if max(qk_width(spec), spec.head_dim_v) > 128 and cfg.block_n != 64:
        return "consumers: hd256 takes block_n = 64 (a 64 x 256 fp32 accumulator leaves no registers for 128 keys)"
    if not 2 <= cfg.num_stages <= 4:
        return "consumers: num_stages (the K / V ring's depth) is 2 to 4"
    need = ws_smem_bytes(spec, cfg)
    if need > SMEM_LIMIT[spec.target]:
        return f"consumers: needs ~{need} B of shared memory (limit {SMEM_LIMIT[spec.target]})"
    return None


def ws_fallback(spec: KernelSpec, cfg: Fp8Config, device_kind: str = "cuda") -> Fp8Config:
    """The Triton kernel's config for a call the Gluon kernel cannot take (a CPU tensor, rows the
    copy engine cannot address, packed documents): the Triton kernel's default."""
    return triton_fp8_config(spec, device_kind)


def triton_fp8_config(spec: KernelSpec, device_kind: str = "cuda") -> Fp8Config:
    """The Triton kernel's default config."""
    if device_kind == "cpu":
        return Fp8Config(32, 32, 4, 1)
    if qk_width(spec) > 128 or spec.head_dim_v > 128:
        return Fp8Config(64, 64, 4, 2)
    return Fp8Config(128, 64, 8, 3)


def ws_fp8_maxnreg(spec: KernelSpec, cfg: Fp8Config) -> int:
    """The Gluon kernel's launch register cap: three warp groups (two consumers take
    WS_CONSUMER_REGS each back from the producer) or, with one consumer up to hd128, 128 so that
    two programs share an SM (hd256's 64 x 256 accumulator needs more: WS_MAXNREG)."""
    from attngen.families.fwd import WS_MAXNREG_ONE

    if cfg.consumers == 1 and max(qk_width(spec), spec.head_dim_v) <= 128:
        return WS_MAXNREG_ONE
    return WS_MAXNREG


def portable_fp8(cfg: Fp8Config, spec: KernelSpec) -> Fp8Config:
    """The config the Triton kernel runs for `cfg` (a plan's downgrade): a Gluon config names the
    Triton kernel's default."""
    return ws_fallback(spec, cfg) if cfg.consumers else cfg
