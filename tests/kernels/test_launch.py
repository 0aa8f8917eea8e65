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
from attngen.kernels import descriptors
from attngen.kernels.descriptors import DESCRIPTOR_FIELDS, Descriptors, make_descriptors, tma_descriptors

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
    monkeypatch.setitem(descriptors.DESCRIPTOR_FIELDS, "triton", ("base", "shape", "strides", "block_shape"))
    descs, tensors = _triton_specs()
    made = Descriptors(descs)
    made(tensors)
    assert made.fast is False
    again = made(_fresh(tensors))
    assert all(type(d) is TensorDescriptor for d in again.values())


def _raw(make_arg, dtype=torch.bfloat16):
    """A RawLauncher over a recording stand-in for Triton's C launcher: one descriptor slot (desc_q
    over tensor Q) and one pointer slot (Out), two bound scalars."""
    import functools

    from attngen.kernels import launch as L

    got = []
    r = object.__new__(L.RawLauncher)
    r.launcher = lambda *args: got.append(args)
    r.head = (7, 1, 1, None, "function", False, False, None, None, "packed", None, None, None)
    enc = functools.partial(L._encode, make_arg, "meta", [1, 2, 64, 32], [4096, 2048, 32, 1], "zero", dtype,
                            "desc_q")
    r.slots = (("Q", {}, enc), "Out")
    r.tail = (3, 4)
    r.pick = L.RawLauncher.picker(r.slots)
    assert r.pick is None  # a descriptor slot: the slots are walked
    return r, got


@pytest.mark.parametrize("slots", [("Q", "Out", "Lse"), ("Out",), ()])
def test_raw_launcher_without_descriptors_picks_the_same_arguments(slots):
    """With no descriptor slot the arguments come from the call's dict in one lookup: the C
    launcher gets what walking the slots gives (head with the call's stream, each pointer as
    given, tensor or integer address, then the bound scalars)."""
    from attngen.kernels import launch as L

    got = []
    r = object.__new__(L.RawLauncher)
    r.launcher = lambda *args: got.append(args)
    r.head = (7, 1, 1, None, "function", False, False, None, None, "packed", None, None, None)
    r.slots, r.tail = slots, (3, 4)
    tensors = {"Q": torch.zeros(2), "Out": 0x7F0000, "Lse": torch.ones(3), "Unused": None}
    r.pick = L.RawLauncher.picker(slots)
    assert r.pick is not None
    r(tensors, 99)
    r.pick = None
    r(tensors, 99)
    assert len(got) == 2 and len(got[0]) == 13 + len(slots) + 2
    assert all(a is b for a, b in zip(got[0], got[1])) and got[0][3] == 99
    assert all(x is tensors[n] for x, n in zip(got[0][13:], slots)) and got[0][-2:] == (3, 4)


def test_raw_launcher_encodes_a_descriptor_once_per_address():
    """The raw replay's arguments are the C launcher's: the head with the call's stream, each
    descriptor as (map, shape, strides) encoded by Triton's function once per base address, each
    pointer as given (a tensor or an integer address), then the bound scalars."""
    from attngen.kernels.launch import RawLauncher

    encoded = []

    def make_arg(desc, meta):
        encoded.append(desc.base.data_ptr())
        assert meta == "meta" and desc.padding == "zero"
        return [f"map@{desc.base.data_ptr():x}", *desc.shape, *desc.strides]

    r, got = _raw(make_arg)
    q = torch.empty(1, 2, 64, 32, dtype=torch.bfloat16)
    out = torch.empty(4)
    r({"Q": q, "Out": out}, 99)
    r({"Q": q, "Out": 12345}, 98)
    assert encoded == [q.data_ptr()]  # the second call reused the map
    assert got[0] == (7, 1, 1, 99, "function", False, False, None, None, "packed", None, None, None,
                      f"map@{q.data_ptr():x}", 1, 2, 64, 32, 4096, 2048, 32, 1, out, 3, 4)
    assert got[1][3] == 98 and got[1][-3] == 12345
    base = q.data_ptr()
    for i in range(RawLauncher.MAX_MAPS + 1):  # integer addresses: a plan's own buffers
        r({"Q": base + 16 * (i + 1), "Out": None}, 0)
    maps = r.slots[0][1]  # full at MAX_MAPS: dropped, then refilled
    assert base not in maps and len(maps) == 2 and base + 16 * (RawLauncher.MAX_MAPS + 1) in maps


def test_raw_launcher_refuses_a_misaligned_base_or_another_dtype():
    r, _ = _raw(lambda desc, meta: ["map"])
    q = torch.empty(1, 2, 64, 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="desc_q: base address 0x[0-9a-f]+ is not 16-byte aligned"):
        r({"Q": q.data_ptr() + 2, "Out": None}, 0)
    with pytest.raises(ValueError, match="desc_q: tensor is torch.float16, the descriptor was built for torch.bfloat16"):
        r({"Q": q.to(torch.float16), "Out": None}, 0)


def test_raw_launcher_only_where_triton_builds_its_launcher_as_3_6_does():
    """RawLauncher.of gives up (the launch keeps Triton's kernel.run) for a kernel whose launcher
    is not a 3.6 CudaLauncher: no `launch`, global scratch memory, or a wrapper of another shape."""
    import types

    from attngen.kernels.launch import RawLauncher

    def launch_of(run, descs=None):
        kernel = types.SimpleNamespace(run=run, packed_metadata=(), function=1)
        return types.SimpleNamespace(kernel=kernel, descs=descs, tensor_names=(), names=(), grid=1, tail=())

    assert RawLauncher.of(launch_of(object())) is None
    scratch = types.SimpleNamespace(launch=print, global_scratch_size=64, profile_scratch_size=0)
    assert RawLauncher.of(launch_of(scratch)) is None

    def outer():
        x = 1

        def inner(*a):
            return x
        return inner
    wrapped = types.SimpleNamespace(launch=outer(), global_scratch_size=0, profile_scratch_size=0,
                                    launch_cooperative_grid=False, launch_pdl=False)
    assert RawLauncher.of(launch_of(wrapped)) is None  # a closure, but not wrap_handle_tensordesc's
    plain = types.SimpleNamespace(launch=print, global_scratch_size=0, profile_scratch_size=0,
                                  launch_cooperative_grid=False, launch_pdl=False)
    raw = RawLauncher.of(launch_of(plain))  # no descriptors: the C launcher itself
    assert raw is not None and raw.launcher is print and raw.slots == ()


def test_a_gluon_entrys_host_descriptors_and_kernel_scratch_come_from_its_abi():
    """descriptors.host_part keeps the descriptors an entry point takes as parameters (its ABI's
    "desc" role) and makes_descriptors says whether it loads a tensor it takes no descriptor of
    (so it makes one in the kernel and needs global scratch): the packed-documents dK/dV pass as
    built (Q / dO made per document) and as ws_doc_desc=host renders it (every one from the host),
    first column tile named desc_q or desc_q0."""
    from types import SimpleNamespace

    from attngen.kernels.descriptors import host_part, makes_descriptors

    built = SimpleNamespace(ABI={"e": (("desc_k", "desc"), ("desc_v", "desc"), ("Q", "tensor"), ("DO", "tensor"))})
    host = SimpleNamespace(ABI={"e": (("desc_q", "desc"), ("desc_k", "desc"), ("desc_v", "desc"),
                                      ("desc_do", "desc"), ("Q", "tensor"))})
    tiles = SimpleNamespace(ABI={"e": (("desc_q0", "desc"), ("desc_q1", "desc"), ("desc_k0", "desc"))})
    descs = {n: ("T", [1], [1], [1]) for n in ("desc_q", "desc_k", "desc_v", "desc_do", "desc_dk", "desc_dv")}
    assert sorted(host_part(descs, built, "e")) == ["desc_k", "desc_v"]
    assert sorted(host_part(descs, host, "e")) == ["desc_do", "desc_k", "desc_q", "desc_v"]
    assert makes_descriptors(built, "e", "desc_q") and not makes_descriptors(host, "e", "desc_q")
    assert not makes_descriptors(tiles, "e", "desc_q") and makes_descriptors(tiles, "e", "desc_v")
