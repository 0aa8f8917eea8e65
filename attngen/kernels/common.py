"""Values every launcher computes the same way."""

from __future__ import annotations

import math
from dataclasses import dataclass

LOG2E = 1.4426950408889634
UNBOUNDED = 1 << 30  # a window side of -1 (unbounded) becomes this many keys
# The longest sequence (and packed document) the kernels take: their mask bounds (row + diagonal
# offset + window side, each below 2^30) stay int32, with a block of headroom
MAX_SEQLEN = UNBOUNDED - 1024


@dataclass(frozen=True)
class MaskArgs:
    """Launch-time mask and score values (the kernel's structure comes from its KernelSpec)."""

    scale: float
    softcap: float  # 0 = off
    window_left: int  # keys before the diagonal, UNBOUNDED = no limit
    window_right: int  # keys after the diagonal (0 for causal)
    align_top_left: bool

    def score_args(self) -> tuple[float, float, float]:
        """(qk_scale, softcap_in, softcap_out) as the kernels take them (log2 domain)."""
        if self.softcap > 0:
            return self.scale * LOG2E, self.scale / self.softcap, self.softcap * LOG2E
        return self.scale * LOG2E, 1.0, 1.0

    def diag_offset(self, seqlen_q: int, seqlen_k: int) -> int:
        return 0 if self.align_top_left else seqlen_k - seqlen_q


def mask_kind(causal: bool, window_size: tuple[int, int]) -> tuple[str, int, int]:
    """(mask, window_left, window_right) for an API call, flash-attn conventions:
    window_size=(left, right), -1 = unbounded; causal forces right = 0."""
    left, right = window_size
    if causal:
        right = 0
    if left < 0 and (right < 0 or (causal and right == 0)):
        return ("causal", UNBOUNDED, 0) if causal else ("none", UNBOUNDED, UNBOUNDED)
    # a side wider than any sequence is no limit: it becomes UNBOUNDED (int32-safe mask bounds)
    return ("sliding_window", UNBOUNDED if left < 0 else min(left, UNBOUNDED),
            UNBOUNDED if right < 0 else min(right, UNBOUNDED))


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)
