"""Kernel launches bound by name: the one launch ABI of every generated family.

A family's launcher (fwd.py, bwd.py, ...) computes named values -- tensors, strides, lengths, mask
values, constexprs -- and the generated module's ABI decides their order: each entry point declares
its parameters with their roles once, in the template (templates/_common.py.jinja, entry()), and
the module exports them as `ABI` (entry point -> ((parameter, role), ...)) and `VARIANTS` (the
entry points it defines). No launcher writes a kernel's positional argument list by hand, and a
template that adds a parameter needs no launcher edit beyond the value. A kernel's tensor and
descriptor parameters come first (the ABI says where they end): a cached launch replays the same
scalars with new tensors.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from dataclasses import dataclass
from typing import Any

import torch
import triton
from triton import knobs

from attngen.kernels.descriptors import Descriptors, ensure_allocator, make_descriptors

INT32_LIMIT = 1 << 31
MAX_GRID = (1 << 31) - 1  # CUDA's limit on the grid's x axis, the only axis attngen uses
TENSOR_ROLES = ("tensor", "desc")  # the ABI roles a call passes per call (the rest is bound once)


def has_entry(mod, name: str) -> bool:
    """Whether the generated module `mod` defines entry point `name` (its VARIANTS say)."""
    return name in mod.VARIANTS


def roles(mod, name: str) -> dict[str, str]:
    """Parameter -> role of entry point `name` of `mod`, as its template declared them."""
    return dict(mod.ABI[name])


@dataclass
class Launch:
    """One kernel launch: `fn[(grid,)](*bound args, num_warps=, num_stages=[, maxnreg=])`."""

    fn: Any  # a triton JITFunction (or the interpreter's InterpretedFunction)
    grid: int
    values: dict[str, Any]  # kernel parameter name -> value (constexprs included)
    num_warps: int
    num_stages: int
    # TMA descriptor parameters: name -> (tensor name, shape, strides, block shape); rebuilt around
    # each call's tensors by whoever replays the launch (runtime plans)
    descriptors: dict | None = None
    # the kernel makes tensor descriptors in global scratch memory (Triton asks its allocator for
    # it at each launch): see ensure_allocator
    scratch: bool = False
    # ptxas's register cap per thread (0: the compiler's choice); a lower cap can fit one more
    # program on an SM
    maxnreg: int = 0
    # the entry point's ABI record ((parameter, role), ...), as the module exports it
    params: tuple = ()
    # launched with programmatic dependent launch (sm90): it may start while the kernel before it
    # finishes, and waits for it inside (the kernel's PDL constexpr, templates/_common.py.jinja)
    pdl: bool = False
    # False: the compiler keeps every fp32 multiply and add rounded on its own (no FMA), so the
    # kernel rounds as PyTorch's element-wise ops do (the decode append's fused rotary)
    fp_fusion: bool = True

    @classmethod
    def of(cls, mod, name: str, grid: int, values: dict, num_warps: int, num_stages: int,
           descriptors: dict | None = None, scratch: bool = False, maxnreg: int = 0, pdl: bool = False,
           fp_fusion: bool = True) -> "Launch":
        """The launch of entry point `name` of the generated module `mod`, bound through its ABI."""
        return cls(getattr(mod, name), grid, values, num_warps, num_stages, descriptors, scratch, maxnreg,
                   mod.ABI[name], pdl, fp_fusion)

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.params)

    @property
    def options(self) -> dict:
        """Triton's launch options of this launch."""
        opts = {"num_warps": self.num_warps, "num_stages": self.num_stages}
        if self.maxnreg:
            opts["maxnreg"] = self.maxnreg
        if self.pdl:
            opts["launch_pdl"] = True
        if not self.fp_fusion:
            opts["enable_fp_fusion"] = False
        return opts

    @property
    def num_tensors(self) -> int:
        """The leading tensor / descriptor parameters (ABI roles), which a replay passes per call."""
        n = next((i for i, (_, role) in enumerate(self.params) if role not in TENSOR_ROLES), len(self.params))
        late = [name for name, role in self.params[n:] if role in TENSOR_ROLES]
        if late:
            raise TypeError(f"{self.fn.__name__}: tensor parameter(s) {late} after its first scalar; "
                            "the ABI puts every tensor and descriptor first")
        return n

    def args(self) -> tuple:
        names = self.param_names
        missing = [n for n in names if n not in self.values]
        if missing:
            raise TypeError(f"{self.fn.__name__}: no value for parameter(s) {missing}")
        return tuple(self.values[n] for n in names)

    def run(self):
        """Launch through Triton's JIT (compiles on the first call of a specialization); returns
        what Triton returns (the compiled kernel on a GPU)."""
        if self.grid == 0:
            return None
        if self.descriptors:
            self.values.update(make_descriptors(self.descriptors, self.values))
        if self.scratch:
            ensure_allocator()
        return self.fn[(self.grid,)](*self.args(), **self.options)


def pdl(t) -> bool:
    """Whether launches on t's device may use programmatic dependent launch (Launch.pdl and the
    kernels' PDL constexpr, templates/_pdl.py.jinja): an sm90 or newer GPU (`griddepcontrol` is
    sm90 PTX; Triton's interpreter runs no inline assembly)."""
    return t.device.type == "cuda" and capability(t.device.index or 0) >= (9, 0)


@functools.lru_cache(maxsize=None)
def capability(index: int) -> tuple[int, int]:
    """The compute capability of CUDA device `index` (asked once per device)."""
    return torch.cuda.get_device_capability(index)


def programs(blocks: int, batch_heads: int, what: str) -> int:
    """Programs of a (sequence blocks x batch x heads) 1-D grid (packed documents: documents x
    heads); a clear error past CUDA's limit, saying how far to split the call."""
    n = blocks * batch_heads
    if n > MAX_GRID:
        raise ValueError(f"{what}: {blocks} blocks x {batch_heads} (batch or documents) x heads = {n} "
                         f"programs is above CUDA's grid limit {MAX_GRID}; split the batch (or the "
                         f"packed documents) into several calls of at most {MAX_GRID // max(blocks, 1)} "
                         f"(batch or documents) x heads each")
    return n


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    import torch

    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device) -> int:
    """Streaming multiprocessors of `device` (a persistent kernel starts a few programs per SM);
    the interpreter (a CPU device) counts as 2, so its tests walk several tiles per program."""
    if device.type != "cuda":
        return 2
    return _sm_count(device.index if device.index is not None else 0)


def call_extent(q, k, cu_seqlens_q=None, max_seqlen_q: int = 0) -> tuple[int, int, int, int, int]:
    """(query heads, programs' batch x heads, seqlen_q, seqlen_k, query rows) of a forward call:
    dense q (B, H, S, D), k (B, Hkv, S, D); packed q (T, H, D) with cu_seqlens_q, where batch x heads
    counts documents x heads, the lengths come per document from cu_seqlens (0 here) and the rows
    are max_seqlen_q."""
    if cu_seqlens_q is not None:
        hq = q.shape[1]
        return hq, (cu_seqlens_q.numel() - 1) * hq, 0, 0, max_seqlen_q if q.shape[0] else 0
    B, hq, seqlen_q, _ = q.shape
    return hq, B * hq, seqlen_q, k.shape[2], seqlen_q


def strides4(prefix: str, t, packed: bool = False) -> dict[str, int]:
    """stride_<p>z/h/m/k of a (B, H, S, D) view, or of a packed (T, H, D) tensor (no batch axis:
    documents are addressed through cu_seqlens)."""
    if packed:
        s = (0, t.stride(1), t.stride(0), t.stride(2))
    else:
        s = t.stride()
    seq = "n" if prefix in ("k", "v", "dk", "dv") else "m"
    return {f"stride_{prefix}z": s[0], f"stride_{prefix}h": s[1], f"stride_{prefix}{seq}": s[2],
            f"stride_{prefix}k": s[3]}


def lse_strides(t, packed: bool = False) -> dict[str, int]:
    """stride_lz/lh/lm of the fp32 LSE-shaped tensors (B, H, S), or (H, T) packed."""
    if packed:
        return {"stride_lz": 0, "stride_lh": t.stride(0), "stride_lm": t.stride(1)}
    return {"stride_lz": t.stride(0), "stride_lh": t.stride(1), "stride_lm": t.stride(2)}


def span(t) -> int:
    """1 + the largest element offset a kernel can form inside `t` (its numel when contiguous)."""
    if t.is_contiguous():
        return t.numel()
    return 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()) if n > 0)


def needs_int64(*tensors) -> bool:
    """True when an element offset inside one of `tensors` can pass 2^31: the kernels then form
    sequence offsets in 64-bit (OFFS_64); everywhere else 32-bit arithmetic stays."""
    return any(t is not None and span(t) >= INT32_LIMIT for t in tensors)


class CompiledLaunch:
    """One kernel launch with its scalars bound; tensors arrive per call (a dict by parameter
    name; TMA descriptors are made here, around the tensors their specs name).

    The first call goes through Triton's JIT, which compiles the kernel; later calls on a GPU
    replay it. With Triton 3.6's launcher (RawLauncher) a replay calls the compiled C launcher
    directly: pointers may be given as tensors or as integer addresses, and each descriptor's
    CUtensorMap is encoded once per base address (everything else in it is the plan's)."""

    __slots__ = ("fn", "grid", "tensor_names", "pick", "tail", "options", "kernel", "device_index",
                 "direct", "scratch", "descs", "raw", "names")

    def __init__(self, launch: Launch, device: torch.device, interpret: bool):
        names = launch.param_names
        self.fn, self.grid = launch.fn, launch.grid
        self.tensor_names = tuple(names[:launch.num_tensors])
        self.names = self.tensor_names  # where each parameter's tensor is found in a call's dict
        self.pick = operator.itemgetter(*self.tensor_names)
        # the scalars and constexprs after the leading tensors (descriptors come per call)
        self.tail = tuple(launch.values[n] for n in names[launch.num_tensors:])
        self.options = launch.options
        self.kernel = None
        self.device_index = device.index if device.type == "cuda" else None
        self.direct = not interpret and device.type == "cuda"
        self.scratch = launch.scratch
        self.descs = Descriptors(launch.descriptors) if launch.descriptors else None
        self.raw = None

    def rename(self, names: dict) -> None:
        """Take this launch's tensors from a call's dict under other names (parameter -> name),
        so that several launches share one dict."""
        self.names = tuple(names.get(n, n) for n in self.tensor_names)
        self.pick = operator.itemgetter(*self.names)
        if self.descs is not None:
            self.descs = Descriptors({d: (names.get(src, src), *rest) for d, (src, *rest) in self.descs.specs.items()})

    def __call__(self, tensors: dict, aligned: bool) -> None:
        if self.grid == 0:
            return
        raw = self.raw
        if raw is not None and aligned and _hooks_off():
            raw(tensors, _stream(self.device_index))
            return
        if self.descs is not None:
            tensors = {**tensors, **self.descs(tensors)}
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
            self.raw = RawLauncher.of(self)

    @property
    def ready(self) -> bool:
        """Whether calls replay through the raw launcher (and may pass integer addresses)."""
        return self.grid == 0 or self.raw is not None


class _Address:
    """A device address standing in for a descriptor's base tensor when one is encoded."""

    __slots__ = ("ptr", )

    def __init__(self, ptr: int):
        self.ptr = ptr

    def data_ptr(self) -> int:
        return self.ptr


class RawLauncher:
    """A compiled kernel's launch through Triton 3.6's C launcher (the `launcher` its
    CudaLauncher wraps), without the Python layers around it: the per-call scratch allocation
    (none for these kernels), the argument loop, and the encoding of each TMA descriptor's
    CUtensorMap, which here is done once per (descriptor, base address) and kept (a map holds the
    base address and the plan's shape, strides and box; nothing of a call's tensor besides the
    address). of() returns None where the launcher is built otherwise (another Triton, a kernel
    that needs global scratch memory): those launches keep kernel.run."""

    MAX_MAPS = 16  # encoded maps kept per descriptor (a call's buffers recycle a few addresses)
    __slots__ = ("launcher", "head", "slots", "tail", "pick")

    @classmethod
    def of(cls, cl: "CompiledLaunch"):
        kernel = cl.kernel
        run = getattr(kernel, "run", None)
        wrapped = getattr(run, "launch", None)
        if (wrapped is None or getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1)
                or not hasattr(kernel, "packed_metadata") or not hasattr(kernel, "function")):
            return None
        cells = dict(zip(getattr(getattr(wrapped, "__code__", None), "co_freevars", ()),
                         (c.cell_contents for c in getattr(wrapped, "__closure__", None) or ())))
        if cl.descs is None:
            if cells:  # wrap_handle_tensordesc returns the C launcher itself when no arg is a descriptor
                return None
            launcher, meta = wrapped, []
        else:
            if set(cells) != {"launcher", "tensordesc_indices", "tensordesc_meta"}:
                return None
            launcher, meta = cells["launcher"], cells["tensordesc_meta"]
            if not meta or any(m is None for m in meta):  # descriptors passed as shape and strides
                return None
        try:
            from triton.backends.nvidia.driver import make_tensordesc_arg
        except ImportError:
            return None
        self = object.__new__(cls)
        self.launcher = launcher
        self.head = (cl.grid, 1, 1, None, kernel.function, run.launch_cooperative_grid, run.launch_pdl, None, None,
                     kernel.packed_metadata, None, None, None)
        specs = cl.descs.specs if cl.descs is not None else {}
        # the fields and dtypes the first call's descriptors were validated with (Descriptors.fast)
        fast = {n: (fields, dtype) for n, _, _, fields, dtype in (cl.descs.fast or ())} if specs else {}
        slots, j = [], 0
        for param, name in zip(cl.tensor_names, cl.names):
            if param in specs:
                if param not in fast:
                    return None
                fields, dtype = fast[param]
                slots.append((specs[param][0], {}, functools.partial(
                    _encode, make_tensordesc_arg, meta[j], fields["shape"], fields["strides"],
                    fields["padding"], dtype, param)))
                j += 1
            else:
                slots.append(name)
        if j != len(meta):
            return None
        self.slots, self.tail = tuple(slots), cl.tail
        self.pick = self.picker(self.slots)
        return self

    @staticmethod
    def picker(slots: tuple):
        """Where no slot is a descriptor: a function of the call's dict giving every argument in
        one C-level lookup (a tuple); else None (__call__ walks the slots)."""
        if not all(slot.__class__ is str for slot in slots):
            return None
        if len(slots) > 1:
            return operator.itemgetter(*slots)
        return (lambda t, n=slots[0]: (t[n],)) if slots else (lambda t: ())

    def __call__(self, tensors: dict, stream: int) -> None:
        if self.pick is not None:
            h = self.head
            self.launcher(h[0], h[1], h[2], stream, *h[4:], *self.pick(tensors), *self.tail)
            return
        args = list(self.head)
        args[3] = stream
        for slot in self.slots:
            if slot.__class__ is str:
                args.append(tensors[slot])
                continue
            src, maps, encode = slot
            t = tensors[src]
            ptr = t if t.__class__ is int else t.data_ptr()
            e = maps.get(ptr)
            if e is None:
                e = encode(maps, t, ptr)
            args.extend(e)
        self.launcher(*args, *self.tail)


def _encode(make_arg, meta, shape, strides, padding, dtype, name, maps: dict, t, ptr: int):
    """A descriptor's launcher arguments (CUtensorMap, shape, strides) at base address `ptr`,
    kept in `maps`: the checks Descriptors makes on a later call's tensor (16-byte aligned base,
    the dtype the descriptor was built for; an integer address is a buffer of the plan's own),
    then Triton's own encoding."""
    if ptr & 15:
        raise ValueError(f"{name}: base address {ptr:#x} is not 16-byte aligned (a TMA descriptor's base must be)")
    if t.__class__ is not int and t.dtype is not dtype:
        raise ValueError(f"{name}: tensor is {t.dtype}, the descriptor was built for {dtype}")
    if len(maps) >= RawLauncher.MAX_MAPS:
        maps.clear()
    maps[ptr] = out = tuple(make_arg(_Descriptor(_Address(ptr), shape, strides, padding), meta))
    return out


@dataclass
class _Descriptor:
    """What Triton's launcher reads of a host descriptor when it encodes one."""

    base: Any
    shape: list
    strides: list
    padding: str


def _hooks_off() -> bool:
    """No launch hook registered (a profiler such as proton adds one): the direct launch skips
    Triton's hook plumbing, so with a hook every launch goes through the JIT instead."""
    hook = knobs.runtime.launch_enter_hook
    return hook is None or not getattr(hook, "calls", True)


def _stream(index: int):
    return torch._C._cuda_getCurrentRawStream(index)


def expr_values(extra: dict | None) -> dict:
    """Launch values of an expression kernel's parameter tensors (XP_<name>: the tensor and, per
    axis i, xp_<name>_s<i> / xp_<name>_n<i>, its stride and extent) and learned sinks ("Sinks")."""
    values = {}
    for name, t in (extra or {}).items():
        values[name] = t
        if name.startswith("XP_"):
            short = name[3:]
            for i in range(t.dim()):
                values[f"xp_{short}_s{i}"] = t.stride(i)
                values[f"xp_{short}_n{i}"] = t.shape[i]
    return values
