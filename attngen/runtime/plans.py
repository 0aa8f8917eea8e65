"""Launch plans: everything a call decided, kept so that the next call with the same shapes is one
dict lookup, the output allocations and the kernel launches.

A plan is keyed by what determines kernel, config and every scalar argument: dtypes, device, shapes,
strides and the launch options. Its launches hold the scalar arguments bound once; a call passes
only the tensors. On a GPU the first call of a launch goes through Triton's JIT (compiling if this
specialization is new) and keeps the compiled kernel; later calls launch it directly, skipping
Triton's per-argument specialization. A call whose pointers are not 16-byte aligned goes through
the JIT every time (its specialization differs), so the kept kernel always matches.
"""

from __future__ import annotations

import operator

import torch
from triton import knobs

from attngen.kernels.launch import Launch, ensure_allocator

MAX_PLANS = 4096  # per cache; a full cache is cleared (plans are cheap to rebuild, kernels stay compiled)


class PlanCache(dict):
    def put(self, key, plan):
        if len(self) >= MAX_PLANS:
            self.clear()
        self[key] = plan
        return plan


class CompiledLaunch:
    """One kernel launch with its scalars bound; tensors arrive per call."""

    __slots__ = ("fn", "grid", "tensor_names", "pick", "tail", "options", "kernel", "device_index",
                 "direct", "scratch")

    def __init__(self, launch: Launch, device: torch.device, interpret: bool):
        names = launch.param_names
        self.fn, self.grid = launch.fn, launch.grid
        self.tensor_names = tuple(names[:launch.num_tensors])
        self.pick = operator.itemgetter(*self.tensor_names)
        # the scalars and constexprs after the leading tensors (descriptors come per call)
        self.tail = tuple(launch.values[n] for n in names[launch.num_tensors:])
        self.options = launch.options
        self.kernel = None
        self.device_index = device.index if device.type == "cuda" else None
        self.direct = not interpret and device.type == "cuda"
        self.scratch = launch.scratch

    def __call__(self, tensors: dict, aligned: bool) -> None:
        if self.grid == 0:
            return
        args = self.pick(tensors)
        if self.scratch:
            ensure_allocator()
        kernel = self.kernel
        if kernel is not None and aligned and _hooks_off():
            kernel.run(self.grid, 1, 1, _stream(self.device_index), kernel.function,
                       kernel.packed_metadata, None, None, None, *args, *self.tail)
            return
        kernel = self.fn[(self.grid,)](*args, *self.tail, **self.options)
        if self.direct and aligned and kernel is not None:
            self.kernel = kernel.result() if hasattr(kernel, "result") else kernel


def _hooks_off() -> bool:
    """No launch hook registered (a profiler such as proton adds one): the direct launch skips
    Triton's hook plumbing, so with a hook every launch goes through the JIT instead."""
    hook = knobs.runtime.launch_enter_hook
    return hook is None or not getattr(hook, "calls", True)


def _stream(index: int):
    return torch._C._cuda_getCurrentRawStream(index)


def aligned(q, k, v, *more) -> bool:
    """All base pointers 16-byte aligned (the specialization a cached kernel was compiled for)."""
    acc = q.data_ptr() | k.data_ptr() | v.data_ptr()
    for t in more:
        if t is not None:
            acc |= t.data_ptr()
    return acc & 15 == 0
