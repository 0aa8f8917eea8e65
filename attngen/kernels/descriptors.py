"""TMA descriptors of the launches (attngen.kernels.launch): the descriptor views and block shapes a
launcher asks for, the host descriptors a Gluon entry point takes (its ABI's "desc" role), whether
a kernel makes descriptors of its own in global scratch (and the allocator Triton takes that
scratch from), and the descriptors rebuilt around each call's tensors."""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton
from triton.runtime import _allocation


def _scratch(size: int, alignment: int, stream):
    import torch

    return torch.empty(size, dtype=torch.int8, device="cuda")


def ensure_allocator() -> None:
    """Kernels that make tensor descriptors on the device need global scratch memory, which Triton
    takes from the allocator of the current context (a ContextVar: each thread starts without one,
    autograd's backward thread too). Sets one that allocates from torch's caching allocator, on the
    current device and stream (so CUDA-graph capture keeps it in the graph's pool), unless one is
    set."""
    if _allocation._allocator.get() is _allocation._NULL_ALLOCATOR:
        triton.set_allocator(_scratch)


def tma_descriptors(views: dict, blocks: dict) -> dict | None:
    """{descriptor name: (tensor name, shape, strides, block)} for (B, H, S, D) views, or None when
    a view cannot go through the copy engine (rows not 16-byte aligned, a non-unit head-dim stride,
    an empty tensor). A block given as (shape, "gluon") is a Gluon kernel's: its entry adds the
    shared-memory layout the kernel allocates, chosen here once per plan."""
    out = {}
    for name, (src, view) in views.items():
        esize = view.element_size()
        if (view.numel() == 0 or view.stride(3) != 1 or view.data_ptr() % 16
                or any((st * esize) % 16 for st in view.stride()[:3])):
            return None
        block = blocks[name]
        if isinstance(block, tuple):  # (block shape, "gluon"): a Gluon kernel's descriptor
            out[name] = (src, list(view.shape), list(view.stride()), block[0],
                         _gluon_layout(tuple(block[0]), view.dtype))
        else:
            out[name] = (src, list(view.shape), list(view.stride()), block)
    return out


def host_part(descs: dict, mod, entry: str) -> dict:
    """A Gluon kernel's host descriptors: those of `descs` that entry point `entry` takes as
    parameters (its ABI's "desc" role). A dense call's kernel takes all of them; over packed
    documents a kernel bounds some per document itself (descriptors it makes) or stores through
    pointers, and takes only the rest."""
    params = {n for n, role in mod.ABI[entry] if role == "desc"}
    return {n: d for n, d in descs.items() if n in params}


def makes_descriptors(mod, entry: str, loaded: str) -> bool:
    """Whether entry point `entry` makes descriptors in the kernel (and so needs global scratch,
    Launch.scratch) for the tensor it loads through `loaded` ("desc_q": its first column tile's
    parameter name, desc_q or desc_q0): it loads it through the copy engine but takes no such
    descriptor as a parameter."""
    params = {n for n, role in mod.ABI[entry] if role == "desc"}
    return loaded not in params and f"{loaded}0" not in params


def descriptor_view(t, packed: bool):
    """The 4-D view a TMA descriptor covers: a dense (B, H, S, D) view as it is; a packed (T, H, D)
    tensor as (1, H, T, D), which the packed-document kernels address as batch 0, head h, rows from
    the document's first token."""
    return t.permute(1, 0, 2).unsqueeze(0) if packed else t


def tile_names(prefix: str, tiles) -> list[str]:
    """Kernel parameter names of an argument given per head-dim column tile (a module's QK_TILES /
    V_TILES), as the templates name them: `prefix` for one tile, prefix0, prefix1, ... for more."""
    return [prefix] if len(tiles) == 1 else [f"{prefix}{i}" for i in range(len(tiles))]


def make_descriptors(descs: dict, tensors: dict) -> dict:
    """Descriptors around `tensors` (name -> tensor): Triton's for a 4-tuple entry, Gluon's for a
    5-tuple (..., shared-memory layout). Triton's constructors validate each one (a plan's
    Descriptors does that once, then skips it)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor
    from triton.tools.tensor_descriptor import TensorDescriptor

    out = {}
    for name, (src, shape, strides, block, *layout) in descs.items():
        if layout:
            out[name] = GluonDescriptor(tensors[src], shape, strides, block, layout[0])
        else:
            out[name] = TensorDescriptor(tensors[src], shape, strides, block)
    return out


# The fields of Triton's host descriptors (Triton 3.6: triton.tools.tensor_descriptor.TensorDescriptor
# and triton.experimental.gluon.nvidia.hopper.TensorDescriptor), dataclasses whose __post_init__
# only validates. Descriptors makes them without __init__ when an instance holds exactly these
# fields; otherwise (another Triton) it keeps Triton's constructors.
DESCRIPTOR_FIELDS = {"triton": ("base", "shape", "strides", "block_shape", "padding"),
                     "gluon": ("base", "shape", "strides", "block_shape", "layout", "padding")}


class Descriptors:
    """A plan's descriptors of one launch, around each call's tensors. What Triton's constructors
    check (rank, power-of-two block, 16-byte strides, a contiguous last dim, the layout) depends
    on the shapes, strides, blocks, layouts and dtypes a plan fixes, and on the base address: the
    first call builds them with the constructors (make_descriptors), later calls make the same
    dataclass instances directly (object.__new__ and the fields the first call validated) and check
    the bases' 16-byte alignment and dtype themselves."""

    __slots__ = ("specs", "fast")

    def __init__(self, descs: dict):
        self.specs = descs
        # ((name, tensor name, class, fields, dtype), ...) after the first call; False: Triton's
        # classes are not the ones DESCRIPTOR_FIELDS describes, the constructors build every call
        self.fast = None

    def __call__(self, tensors: dict) -> dict:
        fast = self.fast
        if not fast:
            out = make_descriptors(self.specs, tensors)
            if fast is None:
                self.fast = _fast_fields(self.specs, out, tensors)
            return out
        out = {}
        for name, src, cls, fields, dtype in fast:
            t = tensors[src]
            if t.data_ptr() & 15 or t.dtype is not dtype:
                _misfit(name, src, t, dtype)
            f = fields.copy()
            f["base"] = t
            out[name] = d = _new(cls)
            d.__dict__ = f
        return out


_new = object.__new__


def _fast_fields(descs: dict, built: dict, tensors: dict):
    """Descriptors.fast from the first call's validated descriptors, or False when one of them is
    not a dataclass holding exactly DESCRIPTOR_FIELDS (another Triton)."""
    out = []
    for name, (src, *rest) in descs.items():
        d = built[name]
        expect = DESCRIPTOR_FIELDS["gluon" if len(rest) == 4 else "triton"]
        fields = getattr(d, "__dict__", None)
        if (fields is None or tuple(fields) != expect or not dataclasses.is_dataclass(d)
                or tuple(f.name for f in dataclasses.fields(d)) != expect):
            return False
        out.append((name, src, type(d), dict(fields, base=None), tensors[src].dtype))
    return tuple(out)


def _misfit(name: str, src: str, t, dtype) -> None:
    if t.dtype is not dtype:
        raise ValueError(f"{name}: tensor {src} is {t.dtype}, the descriptor was built for {dtype}")
    raise ValueError(f"{name}: tensor {src}'s base address {t.data_ptr():#x} is not 16-byte aligned "
                     "(a TMA descriptor's base must be)")


@functools.lru_cache(maxsize=None)
def _gluon_layout(block: tuple, dtype):
    """The NVMMA shared-memory layout a Gluon kernel allocates for a (block, torch dtype) tile."""
    import torch
    from triton.experimental.gluon import language as gl

    return gl.NVMMASharedLayout.get_default_for(list(block), {torch.bfloat16: gl.bfloat16,
                                                              torch.float16: gl.float16}[dtype])
