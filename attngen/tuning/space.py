"""Launch configurations: frozen dataclasses, one validity filter, and the default tables.

Shared by the runtime (defaults) and, later, the tuner (search space). No optional dependencies.
"""

from __future__ import annotations

from dataclasses import dataclass

from attngen.spec import KernelSpec


@dataclass(frozen=True)
class FwdConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int

    def as_dict(self) -> dict:
        return {"block_m": self.block_m, "block_n": self.block_n,
                "num_warps": self.num_warps, "num_stages": self.num_stages}


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

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


# Shared memory per block, bytes (the opt-in limit).
SMEM_LIMIT = {"sm80": 163 * 1024, "sm90": 227 * 1024}


def fwd_smem_bytes(spec: KernelSpec, cfg: FwdConfig) -> int:
    """Rough shared-memory need: Q tile once, K and V tiles per pipeline stage (2-byte elements)."""
    dqk, dv = next_pow2(spec.head_dim_qk), next_pow2(spec.head_dim_v)
    return 2 * (cfg.block_m * dqk + max(cfg.num_stages - 1, 1) * cfg.block_n * (dqk + dv))


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
    need, have = fwd_smem_bytes(spec, cfg), SMEM_LIMIT.get(spec.target, SMEM_LIMIT["sm80"])
    if need > have:
        return f"needs ~{need} B of shared memory, {spec.target} has {have}"
    return None


def default_fwd_config(spec: KernelSpec, device_kind: str = "cuda", seqlen_q: int = 0) -> FwdConfig:
    """Defaults per head dim, the best of benchmarks/sweep_configs.py on an H200
    (benchmarks/results/h200_sweep_2026-11-30.json); the interpreter gets big tiles because its
    cost is per tile operation."""
    d = max(spec.head_dim_qk, spec.head_dim_v)
    if device_kind == "cpu":
        return FwdConfig(64, 64, 4, 1)
    if d <= 64:
        return FwdConfig(128, 64, 8, 4)
    if d <= 128:
        # short sequences (and packed documents up to 1k) fill the GPU better with 64-row tiles:
        # 315 vs 295 TFLOP/s on 8 x 1024-token causal documents; a 1024-key window too: 348 vs
        # 334 (h200_sweep_split_2026-11-30.json)
        if spec.mask == "sliding_window":
            return FwdConfig(64, 64, 4, 2)
        return FwdConfig(64, 64, 4, 3) if 0 < seqlen_q <= 1024 else FwdConfig(128, 64, 8, 3)
    # hd256: 398 TFLOP/s vs 339 for 64x32x4x2 (h200_sweep_hd256_2026-11-30.json)
    return FwdConfig(128, 64, 8, 2)


def default_bwd_config(spec: KernelSpec, device_kind: str = "cuda") -> BwdConfig:
    """On the H200 sweep the separate dQ pass beat fp32 atomics (hd128 causal: 347 vs 302 TFLOP/s
    backward-only), so it is the default; atomic_dq stays a tunable knob."""
    d = max(spec.head_dim_qk, spec.head_dim_v)
    if device_kind == "cpu":
        return BwdConfig(32, 64, 4, 1, 64, 32, 4, 1)
    if d <= 128:  # dK/dV and dQ swept separately (h200_sweep_split_2026-11-30.json)
        return BwdConfig(64, 64, 4, 2, 128, 64, 8, 3)
    # hd256: 173 TFLOP/s backward-only vs 69 for 32x64x4x1 (h200_sweep_hd256_2026-11-30.json)
    return BwdConfig(64, 64, 8, 2, 64, 64, 8, 2)
