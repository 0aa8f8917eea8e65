"""Grids within CUDA's limits on the sm90 family, on a CPU: the launchers build their launches on
meta tensors (nothing is allocated, nothing runs) as they would on an H200 (the sm90 kernels, the
h100 class's configs, Gluon allowed, 132 SMs).

* The GPU edge cases (tests/gpu/test_gpu_edges.py: EDGES) take the kernels and grids those tests
  expect, through the runtime's own plans (host-bound shapes, config choice, fallbacks included).
* Huge batch x heads and many documents fold onto one grid axis on every forward (Gluon, TMA,
  pointer) and backward (Gluon, TMA, pointer) kernel; persistent grids stay within the SM count.
* A grid of exactly 2^31 - 1 programs launches; one more is a ValueError before any launch, whose
  message says how far to split the call (through attngen.attention_varlen and the launchers).

Dense calls here use tensors of one batch entry expanded along the batch axis (packed: one token
along the token axis): offsets stay 32-bit, so the Gluon and TMA kernels may take calls of any
batch; a contiguous tensor past 2^31 elements would put the backward on the 64-bit pointer kernels.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import pytest
import torch
import triton

import attngen
from attngen.families import bwd as kbwd
from attngen.families import fwd as kfwd
from attngen.kernels.launch import MAX_GRID
from attngen.runtime import api, dispatch, loader
from attngen.runtime import validate
from attngen.runtime import plan as plan_mod
from attngen.spec import KernelSpec
from attngen.configs import (WS_BWD_DEFAULT, WS_DEFAULT, WS_DOCS, bwd_triton_fallback,
                                  triton_fallback)
from tests.gpu.test_gpu_edges import EDGES

H200_SMS = 132
META = "meta"
BF16 = torch.bfloat16
MASK = validate.make_options(128, True, (-1, -1), 0.0, None, "bottom_right", "bhsd").mask_args


@pytest.fixture(scope="module", autouse=True)
def kernel_cache(tmp_path_factory):
    """Kernels rendered on demand go to a temporary cache, not the user's."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNGEN_CACHE_DIR", str(tmp_path_factory.mktemp("kernels")))
        yield


@pytest.fixture
def h200(monkeypatch):
    """The runtime as on an H200: sm90 kernels, the h100 class's configs, the Gluon kernels allowed
    (the launchers allow them on CUDA tensors only), 132 SMs. Meta tensors pass the device check."""
    monkeypatch.setattr(plan_mod, "check_device", lambda device, interpret: None)
    monkeypatch.setattr(dispatch, "device_target", lambda device: "sm90")
    monkeypatch.setattr(dispatch, "device_class", lambda device, interpret: "h100")
    monkeypatch.setattr(api, "fwd_launches", functools.partial(kfwd.fwd_launches, gluon=True))
    monkeypatch.setattr(api, "bwd_launches", functools.partial(kbwd.bwd_launches, gluon=True))
    monkeypatch.setattr(kfwd, "sm_count", lambda device: H200_SMS)


def meta(*shape, dtype=BF16, expand_dim: int | None = None):
    """A meta tensor; with expand_dim, one index along that axis expanded to the size (stride 0)."""
    if expand_dim is None:
        return torch.empty(shape, dtype=dtype, device=META)
    one = list(shape)
    one[expand_dim] = 1
    return torch.empty(one, dtype=dtype, device=META).expand(*shape)


def launch_values(cl) -> dict:
    """A plan's compiled launch's scalar and constexpr arguments by name."""
    return dict(zip(cl.fn.arg_names[len(cl.tensor_names):], cl.tail))


def check_grids(launches) -> None:
    """Every launch: a 1-D grid (one int: Launch / CompiledLaunch launch fn[(grid,)]) of 1 to
    2^31 - 1 programs."""
    for la in launches:
        assert type(la.grid) is int, (la.fn.__name__, la.grid)
        assert 0 < la.grid <= MAX_GRID, (la.fn.__name__, la.grid)


def replay(case):
    """The forward and backward plans the runtime builds for a GPU edge case on an H200."""
    shape_q, shape_kv = case.shapes()
    q, k, v = meta(*shape_q), meta(*shape_kv), meta(*shape_kv)
    opts = validate.make_options(case.d, True, (-1, -1), 0.0, None, "bottom_right", case.layout)
    packed = ()
    if case.layout == "packed":
        cu = meta(case.docs + 1, dtype=torch.int32)
        packed = (cu, cu, case.doc_len, case.doc_len)
    fwd = api.ForwardPlan(q, k, v, opts, *packed)
    out, lse = fwd.empty()
    bwd = api.BackwardPlan(torch.empty_like(out), q, k, v, out, lse, opts, False, *packed)
    return fwd, bwd


@pytest.mark.parametrize("case", list(EDGES.values()), ids=list(EDGES))
def test_gpu_edge_cases_launch_what_their_tests_expect(case, h200):
    fwd, bwd = replay(case)
    got = {"fwd": api.plan_launches(fwd), "bwd": api.plan_launches(bwd)}
    assert got == case.expected(H200_SMS), f"{case.id}: EDGES says {case.expected(H200_SMS)}"
    check_grids(fwd.launches + bwd.launches)
    # 64-bit offsets exactly where a tensor passes 2^31 elements
    wide = math.prod(case.shapes()[0]) >= 1 << 31
    for cl in fwd.launches + bwd.launches:
        assert launch_values(cl).get("OFFS_64", wide) == wide, (cl.fn.__name__, wide)


# --------------------------------------------------------------------------------------------------
# every sm90 kernel folds huge batch x heads / many documents onto one axis

B_HUGE, HQ, HKV, S, D = 1 << 20, 32, 8, 256, 128  # 2^25 (batch or documents) x query heads


def _spec(family: str, packed: bool, gqa: int = HQ // HKV) -> tuple[KernelSpec, object]:
    spec = KernelSpec(family, "bf16", "sm90", D, D, gqa, "causal", False, packed)
    return spec, loader.load(spec)


def _fwd_config(kernel: str, spec: KernelSpec):
    """A config that puts a call on `kernel` (the Gluon one one program per tile: not persistent)."""
    ws = dataclasses.replace(WS_DOCS, persistent=0) if spec.varlen else WS_DEFAULT
    if kernel == "_attn_fwd_ws":
        return ws
    tma = triton_fallback(ws, spec)
    return tma if kernel == "_attn_fwd_tma" else dataclasses.replace(tma, tma=False, q_regs=False)


def _fwd_call(packed: bool, batch: int, hq: int = HQ, hkv: int = HKV, seqlen: int = S):
    """(q, k, v, out, lse, packed args) of `batch` sequences or documents of `seqlen` tokens."""
    if packed:
        t = batch * seqlen
        cu = meta(batch + 1, dtype=torch.int32)
        return (meta(t, hq, D, expand_dim=0), meta(t, hkv, D, expand_dim=0), meta(t, hkv, D, expand_dim=0),
                meta(t, hq, D, expand_dim=0), meta(hq, t, dtype=torch.float32, expand_dim=1),
                (cu, cu, seqlen))
    return (meta(batch, hq, seqlen, D, expand_dim=0), meta(batch, hkv, seqlen, D, expand_dim=0),
            meta(batch, hkv, seqlen, D, expand_dim=0), meta(batch, hq, seqlen, D, expand_dim=0),
            meta(batch, hq, seqlen, dtype=torch.float32, expand_dim=0), ())


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
@pytest.mark.parametrize("kernel", ["_attn_fwd_ws", "_attn_fwd_tma", "_attn_fwd"])
def test_forward_folds_huge_batch_heads_onto_one_axis(kernel, packed):
    spec, mod = _spec("fwd", packed)
    cfg = _fwd_config(kernel, spec)
    q, k, v, out, lse, extra = _fwd_call(packed, B_HUGE)
    (la,) = kfwd.fwd_launches(mod, spec, q, k, v, out, lse, MASK, cfg, *extra, gluon=True)
    assert la.fn.__name__ == kernel
    blocks = triton.cdiv(S, cfg.block_m)
    if cfg.pair_tiles:  # two mirrored query tiles per program
        blocks = triton.cdiv(blocks, 2)
    assert la.grid == blocks * B_HUGE * HQ > 65_535
    assert not la.values["OFFS_64"]
    check_grids([la])


def _bwd_config(kind: str):
    if kind == "ws":
        return WS_BWD_DEFAULT
    tma = bwd_triton_fallback(WS_BWD_DEFAULT)
    return tma if kind == "tma" else dataclasses.replace(tma, tma=False)


BWD_KERNELS = {"ws": ("_attn_bwd_dkdv_ws", "_attn_bwd_dq_ws"),
               "tma": ("_attn_bwd_dkdv_tma", "_attn_bwd_dq_tma"),
               "pointer": ("_attn_bwd_dkdv", "_attn_bwd_dq")}


def _bwd_launches(kind: str, packed: bool, batch: int, hq: int = HQ, hkv: int = HKV, seqlen: int = S):
    spec, mod = _spec("bwd", packed, hq // hkv)
    cfg = _bwd_config(kind)
    q, k, v, out, lse, extra = _fwd_call(packed, batch, hq, hkv, seqlen)
    if extra:
        extra = (*extra, seqlen)  # max_seqlen_k
    launches = kbwd.bwd_launches(mod, spec, q, k, v, out, out, lse, lse, q, k, v, MASK, cfg, False,
                                 *extra, gluon=True)
    return cfg, launches


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
@pytest.mark.parametrize("kind", list(BWD_KERNELS))
def test_backward_folds_huge_batch_heads_onto_one_axis(kind, packed):
    cfg, launches = _bwd_launches(kind, packed, B_HUGE)
    names = [la.fn.__name__ for la in launches]
    assert names == ["_attn_bwd_preprocess", *BWD_KERNELS[kind]]
    pre, dkdv, dq = launches
    assert pre.grid == dq.grid == triton.cdiv(S, cfg.dq_block_m) * B_HUGE * HQ > 65_535
    assert dkdv.grid == triton.cdiv(S, cfg.block_n) * B_HUGE * HKV > 65_535
    assert not any(la.values["OFFS_64"] for la in launches)
    check_grids(launches)


@pytest.mark.parametrize("docs", [1, 1 << 20])
def test_persistent_gluon_forward_grid_is_at_most_one_program_per_sm(docs, monkeypatch):
    """Packed documents of 1024 tokens on the persistent Gluon forward: min(work items, SMs)
    programs walk every item, however many documents."""
    monkeypatch.setattr(kfwd, "sm_count", lambda device: H200_SMS)
    spec, mod = _spec("fwd", True)
    q, k, v, out, lse, extra = _fwd_call(True, docs, seqlen=1024)
    (la,) = kfwd.fwd_launches(mod, spec, q, k, v, out, lse, MASK, WS_DOCS, *extra, gluon=True)
    items = triton.cdiv(triton.cdiv(1024, WS_DOCS.block_m), 2) * docs * HQ
    assert la.fn.__name__ == "_attn_fwd_ws" and la.values["PERSIST"]
    assert la.values["num_items"] == items
    assert la.grid == min(items, H200_SMS) <= H200_SMS
    check_grids([la])


def test_persistent_tma_forward_grid_is_at_most_its_programs_per_sm(monkeypatch):
    monkeypatch.setattr(kfwd, "sm_count", lambda device: H200_SMS)
    spec, mod = _spec("fwd", False)
    cfg = dataclasses.replace(_fwd_config("_attn_fwd_tma", spec), persistent=2)
    q, k, v, out, lse, _ = _fwd_call(False, B_HUGE)
    (la,) = kfwd.fwd_launches(mod, spec, q, k, v, out, lse, MASK, cfg, gluon=True)
    tiles = triton.cdiv(S, cfg.block_m) * B_HUGE * HQ
    assert la.fn.__name__ == "_attn_fwd_tma" and la.values["PERSISTENT"]
    assert la.values["num_tiles"] == tiles and la.grid == 2 * H200_SMS
    check_grids([la])


# --------------------------------------------------------------------------------------------------
# 2^31 - 1 programs launch; one more is a clear error before any launch

SPLIT = (r"is above CUDA's grid limit 2147483647; split the batch \(or the packed documents\) into "
         r"several calls of at most {most} \(batch or documents\) x heads each$")


@pytest.mark.parametrize("kernel", ["_attn_fwd_ws", "_attn_fwd_tma", "_attn_fwd"])
def test_forward_grid_of_2_31_minus_1_programs_and_one_more(kernel):
    spec, mod = _spec("fwd", False, gqa=1)
    cfg = _fwd_config(kernel, spec)
    q, k, v, out, lse, _ = _fwd_call(False, MAX_GRID, 1, 1, 64)  # one block of 64 rows per head
    (la,) = kfwd.fwd_launches(mod, spec, q, k, v, out, lse, MASK, cfg, gluon=True)
    assert la.fn.__name__ == kernel and la.grid == MAX_GRID
    q, k, v, out, lse, _ = _fwd_call(False, MAX_GRID + 1, 1, 1, 64)
    msg = rf"^q: 1 blocks x {MAX_GRID + 1} \(batch or documents\) x heads = {MAX_GRID + 1} programs "
    with pytest.raises(ValueError, match=msg + SPLIT.format(most=MAX_GRID)):
        kfwd.fwd_launches(mod, spec, q, k, v, out, lse, MASK, cfg, gluon=True)


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
@pytest.mark.parametrize("kind", list(BWD_KERNELS))
def test_backward_grid_of_2_31_minus_1_programs_and_one_more(kind, packed):
    _, launches = _bwd_launches(kind, packed, MAX_GRID, 1, 1, 64)
    assert [la.grid for la in launches] == [MAX_GRID] * 3
    with pytest.raises(ValueError, match=r"^q: 1 blocks x 2147483648 .*" + SPLIT.format(most=MAX_GRID)):
        _bwd_launches(kind, packed, MAX_GRID + 1, 1, 1, 64)


def test_backward_names_the_key_side_when_only_its_grid_is_too_large():
    """GQA 1: the dK/dV pass has the same rows as the dQ pass; with 32-key blocks under 128-row dQ
    tiles it alone passes the limit, and its error names k."""
    spec, mod = _spec("bwd", False, 1)
    cfg = dataclasses.replace(_bwd_config("pointer"), block_n=32)
    batch = MAX_GRID // 4 + 1  # 4 key blocks x batch > MAX_GRID >= 1 query block x batch
    q, k, v, out, lse, _ = _fwd_call(False, batch, 1, 1, 128)
    with pytest.raises(ValueError, match=rf"^k: 4 blocks x {batch} .*" + SPLIT.format(most=MAX_GRID // 4)):
        kbwd.bwd_launches(mod, spec, q, k, v, out, out, lse, lse, q, k, v, MASK, cfg, False, gluon=True)


def test_too_many_documents_is_a_clear_error_before_any_launch(monkeypatch):
    """attention_varlen over 2^22 documents (one of 1024 tokens, the others empty) x 32 heads on
    the CPU: 16 query blocks x 2^27 (documents x heads) = 2^31 programs. The plan's launcher says
    so before launching anything, and keeps no plan."""
    from attngen.kernels import launch

    def no_launch(*args, **kwargs):
        raise AssertionError("a kernel launched")

    monkeypatch.setattr(launch.CompiledLaunch, "__call__", no_launch)
    docs, L, H, d = 1 << 22, 1024, 32, 64
    q, k, v = (torch.zeros(L, H, d, dtype=torch.float16) for _ in range(3))
    cu = torch.full((docs + 1,), L, dtype=torch.int32)
    cu[0] = 0
    before = len(api._FWD)
    n = 16 * docs * H
    msg = rf"^q: 16 blocks x {docs * H} \(batch or documents\) x heads = {n} programs "
    with pytest.raises(ValueError, match=msg + SPLIT.format(most=MAX_GRID // 16)):
        attngen.attention_varlen(q, k, v, cu, cu, L, L, causal=True)
    assert len(api._FWD) == before
