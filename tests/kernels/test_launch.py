"""attngen.kernels.launch's descriptors: a plan's Descriptors builds the first call's with Triton's
constructors (which validate them) and later calls' directly, equal field for field; a base that is
not 16-byte aligned, or of another dtype, is refused by name; Triton's descriptor classes are the
dataclasses the fast path knows (Triton 3.6), or it keeps the constructors."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor
from triton.tools.tensor_descriptor import TensorDescriptor

from attngen.families import fwd_fp8 as f8
from attngen.kernels import launch
from attngen.kernels.launch import DESCRIPTOR_FIELDS, Descriptors, make_descriptors, tma_descriptors

E4M3 = torch.float8_e4m3fn


def _gluon_specs():
    """The fp8 Gluon kernel's four descriptors (B1 H2 S256 hd64) and a call's tensors."""
    q8, k8 = (torch.empty(1, 2, 256, 64, dtype=E4M3) for _ in range(2))
    vt = torch.empty(1, 2, 64, 256, dtype=E4M3)
    out = torch.empty(1, 2, 256, 64, dtype=torch.bfloat16)
    descs = f8.ws_fp8_descriptors(f8.Fp8Config(128, 128, 12, 3, consumers=2), q8, k8, vt, out)
    return descs, {"Q": q8, "K": k8, "Vt": vt, "Out": out}


def _triton_specs():
    """A TMA kernel's descriptors (Triton's class) over bf16 (B, H, S, D) views."""
    q, k = torch.empty(2, 4, 96, 64, dtype=torch.bfloat16), torch.empty(2, 2, 80, 64, dtype=torch.bfloat16)
    descs = tma_descriptors({"desc_q": ("Q", q), "desc_k": ("K", k)},
                            {"desc_q": [1, 1, 32, 64], "desc_k": [1, 1, 16, 64]})
    return descs, {"Q": q, "K": k}


def _fresh(tensors: dict) -> dict:
    return {n: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype) for n, t in tensors.items()}


def _same(a, b) -> bool:
    """Same class and fields, the base the same tensor object."""
    fa, fb = vars(a), vars(b)
    return (type(a) is type(b) and a.base is b.base and list(fa) == list(fb)
            and all(fa[n] == fb[n] for n in fa if n != "base"))


def test_triton_descriptor_classes_are_the_ones_the_fast_path_knows():
    """Descriptors relies on Triton 3.6's host descriptor classes being plain dataclasses (an
    instance __dict__, no __slots__) with exactly these fields, __post_init__ adding none: if a
    Triton update changes that, this test says so (Descriptors itself falls back to the
    constructors)."""
    for cls, kind in ((TensorDescriptor, "triton"), (GluonDescriptor, "gluon")):
        assert dataclasses.is_dataclass(cls) and "__slots__" not in vars(cls), cls
        assert tuple(f.name for f in dataclasses.fields(cls)) == DESCRIPTOR_FIELDS[kind], cls
    for specs, tensors in (_gluon_specs(), _triton_specs()):
        for d in make_descriptors(specs, tensors).values():
            assert tuple(vars(d)) == DESCRIPTOR_FIELDS["gluon" if type(d) is GluonDescriptor else "triton"]


@pytest.mark.parametrize("specs", [_gluon_specs, _triton_specs], ids=["gluon", "triton"])
def test_later_calls_equal_the_validated_descriptors(specs):
    descs, first = specs()
    made = Descriptors(descs)
    built = made(first)  # Triton's constructors
    assert made.fast and all(_same(built[n], d) for n, d in make_descriptors(descs, first).items())
    for tensors in (first, _fresh(first)):  # the same tensors, then another call's
        fast = made(tensors)
        want = make_descriptors(descs, tensors)
        assert sorted(fast) == sorted(want)
        for name, d in fast.items():
            assert _same(d, want[name]), name
            assert d.base is tensors[descs[name][0]]
    assert dataclasses.replace(fast["desc_q"]).shape == fast["desc_q"].shape  # a complete dataclass


@pytest.mark.parametrize("specs", [_gluon_specs, _triton_specs], ids=["gluon", "triton"])
def test_a_misaligned_or_retyped_base_is_refused(specs):
    descs, tensors = specs()
    made = Descriptors(descs)
    made(tensors)
    name, (src, *_) = next(iter(descs.items()))
    t = tensors[src]
    storage = torch.empty(t.numel() + 16, dtype=t.dtype)
    shifted = storage[1:].as_strided(t.shape, t.stride())  # one element (1 or 2 bytes) off
    with pytest.raises(ValueError, match=rf"{name}: tensor {src}'s base address .* not 16-byte aligned"):
        made({**tensors, src: shifted})
    other = torch.float16 if t.dtype != torch.float16 else torch.bfloat16
    with pytest.raises(ValueError, match=rf"{name}: tensor {src} is {other}, the descriptor was built for"):
        made({**tensors, src: torch.empty_strided(t.shape, t.stride(), dtype=other)})


def test_the_first_call_goes_through_tritons_checks():
    descs, tensors = _triton_specs()
    src, shape, strides, block = descs["desc_q"]
    made = Descriptors({"desc_q": (src, shape, strides, [1, 1, 24, 64])})  # not a power of two
    with pytest.raises(ValueError, match="power of 2"):
        made(tensors)


def test_unknown_descriptor_classes_keep_the_constructors(monkeypatch):
    monkeypatch.setitem(launch.DESCRIPTOR_FIELDS, "triton", ("base", "shape", "strides", "block_shape"))
    descs, tensors = _triton_specs()
    made = Descriptors(descs)
    made(tensors)
    assert made.fast is False
    again = made(_fresh(tensors))
    assert all(type(d) is TensorDescriptor for d in again.values())
