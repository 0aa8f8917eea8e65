"""Launch plans: everything a call decided, kept so that the next call with the same shapes is one
dict lookup, the output allocations and the kernel launches (attngen.kernels.launch.CompiledLaunch).

A plan is keyed by what determines kernel, config and every scalar argument: dtypes, device, shapes,
strides and the launch options. Its launches hold the scalar arguments bound once; a call passes
only the tensors. On a GPU the first call of a launch goes through Triton's JIT (compiling if this
specialization is new) and keeps the compiled kernel; later calls launch it directly, skipping
Triton's per-argument specialization. A call whose pointers are not 16-byte aligned goes through
the JIT every time (its specialization differs), so the kept kernel always matches.
"""

from __future__ import annotations

MAX_PLANS = 4096  # per cache; a full cache is cleared (plans are cheap to rebuild, kernels stay compiled)


class PlanCache(dict):
    def put(self, key, plan):
        if len(self) >= MAX_PLANS:
            self.clear()
        self[key] = plan
        return plan


def aligned(q, k, v, *more) -> bool:
    """All base pointers 16-byte aligned (the specialization a cached kernel was compiled for)."""
    acc = q.data_ptr() | k.data_ptr() | v.data_ptr()
    for t in more:
        if t is not None:
            acc |= t.data_ptr()
    return acc & 15 == 0
