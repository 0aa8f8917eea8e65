"""Search spaces and the validity filter: built generically from the config dataclasses, the
shared-memory models against what Triton asked for on the H200, defaults inside the space."""

from __future__ import annotations

import dataclasses

import pytest

from attngen.families import FAMILIES
from attngen.spec import KernelSpec
from attngen import configs as space
from attngen.families import fwd as fwd_family
from attngen.configs import BwdConfig, FwdConfig


def spec(family="fwd", d=128, target="sm90", gqa=4, mask="causal"):
    return KernelSpec(family, "bf16", target, d, d, gqa, mask)


# Triton 3.6's "out of resource: shared memory, Required: N" on the H200 sweeps
# (benchmarks/results/h200_sweep*_2026-11-30.json), and configs that ran there.
@pytest.mark.parametrize("d, cfg, required", [
    (128, FwdConfig(64, 128, 4, 4), 278528),
    (128, FwdConfig(128, 128, 8, 4), 294912),
    (256, FwdConfig(64, 128, 8, 2), 294912),
])
def test_fwd_smem_model_matches_triton(d, cfg, required):
    assert space.fwd_smem_bytes(spec(d=d), cfg) == required
    assert "shared memory" in space.check_fwd(spec(d=d), cfg)


@pytest.mark.parametrize("d, cfg", [(128, FwdConfig(128, 64, 8, 4)), (128, FwdConfig(128, 128, 8, 3)),
                                    (256, FwdConfig(64, 64, 8, 3)), (256, FwdConfig(128, 64, 8, 2))])
def test_fwd_configs_that_ran_pass(d, cfg):
    assert space.check_fwd(spec(d=d), cfg) is None


def test_bwd_smem_model_matches_triton():
    s = spec("bwd")
    dkdv, _ = space.bwd_smem_bytes(s, BwdConfig(128, 128, 8, 3, 64, 64, 4, 2))
    assert dkdv == 264192
    _, dq = space.bwd_smem_bytes(s, BwdConfig(64, 64, 4, 2, 128, 128, 8, 3))
    assert dq == 262144
    assert space.check_bwd(s, BwdConfig(128, 128, 8, 3, 64, 64, 4, 2)).startswith("dK/dV: needs")
    assert space.check_bwd(s, BwdConfig(64, 64, 4, 2, 128, 128, 8, 3)).startswith("dQ: needs")
    assert space.check_bwd(s, BwdConfig(128, 64, 8, 3, 64, 128, 8, 3)) is None  # ran on the H200


@pytest.mark.parametrize("cfg, reason", [
    (BwdConfig(48, 64, 4, 2, 64, 64, 4, 2), "dK/dV: block sizes must be powers of two"),
    (BwdConfig(64, 64, 4, 2, 8, 64, 4, 2), "dQ: block sizes below 16"),
    (BwdConfig(64, 64, 3, 2, 64, 64, 4, 2), "dK/dV: num_warps"),
    (BwdConfig(64, 64, 4, 2, 64, 64, 4, 0), "dQ: num_stages"),
    (BwdConfig(64, 64, 4, 2, 64, 64, 4, 2, split_dkdv=True), "split_dkdv exists in the sm90 family's TMA"),
    (BwdConfig(64, 64, 4, 2, 64, 64, 4, 2, dq_regs=True), "dq_regs exists in the sm90 family's TMA dQ pass"),
    (BwdConfig(64, 64, 4, 2, 64, 64, 4, 2, tma=True, atomic_dq=True, dq_regs=True), "dq_regs exists"),
])
def test_check_bwd_names_the_kernel_and_the_problem(cfg, reason):
    assert space.check_bwd(spec("bwd"), cfg).startswith(reason)


@pytest.mark.parametrize("cfg, reason", [
    (FwdConfig(64, 64, 4, 3, q_regs=True), "q_regs exists in the sm90 family's TMA kernel only"),
    (FwdConfig(64, 64, 4, 3, tma=True, maxnreg=100), "maxnreg is 0"),
    (FwdConfig(64, 64, 4, 3, tma=True, maxnreg=512), "maxnreg is 0"),
])
def test_check_fwd_register_knobs(cfg, reason):
    assert space.check_fwd(spec(), cfg).startswith(reason)
    assert space.check_fwd(spec(), dataclasses.replace(cfg, tma=True, maxnreg=168)) is None


def test_sm90_defaults_hold_q_in_registers_where_it_won():
    """The Triton kernels' sm90 defaults (what the warp-specialized forward falls back to, and the
    default where it does not exist): q_regs where the H200 A/B measured it faster (dense, hd <=
    128 but hd80), not for packed documents, hd80, hd192 or hd256 (h200_ab_fwd_qregs*_2026-12-01.json)."""
    want = {64: True, 80: False, 96: True, 128: True, 192: False, 256: False}
    for d, regs in want.items():
        dflt = space.triton_fallback(space.default_fwd_config(spec(d=d), "cuda", 4096), spec(d=d))
        assert dflt.q_regs is regs, d
        docs = KernelSpec("fwd", "bf16", "sm90", d, d, 4, "causal", varlen=True)
        docs_dflt = space.triton_fallback(space.default_fwd_config(docs, "cuda", 4096), docs)
        assert docs_dflt.q_regs is False, d
    assert space.default_fwd_config(spec(d=128, target="sm80"), "cuda", 4096).q_regs is False


def test_sm80_has_less_shared_memory():
    cfg = FwdConfig(128, 64, 8, 4)  # 2 * (128*128 + 4*64*256) = 163840 <= 163 KiB = 166912
    assert space.check_fwd(spec(target="sm80"), cfg) is None
    assert "sm80" in space.check_fwd(spec(target="sm80"), FwdConfig(128, 128, 8, 3))
    assert space.check_fwd(spec(target="sm90"), FwdConfig(128, 128, 8, 3)) is None


@pytest.mark.parametrize("family", ["fwd", "bwd"])
@pytest.mark.parametrize("d", [64, 96, 128, 256])
def test_defaults_are_valid_and_inside_the_space(family, d):
    s = spec(family, d, gqa=2)
    sp = space.search_space(FAMILIES[family].config, family, "sm90")
    dflts = ([space.default_fwd_config(s, "cuda", sq) for sq in (512, 4096)] if family == "fwd"
             else [space.default_bwd_config(s, "cuda")])
    for cfg in dflts:
        assert FAMILIES[family].check(s, cfg) is None, cfg
        if getattr(cfg, "consumers", 0) or getattr(cfg, "dq_consumers", 0):
            # the warp-specialized Gluon kernels: the tuner's yardstick, measured first but left
            # out of the search space (their valid corner is a handful of fixed-geometry configs);
            # what they fall back to is inside
            cfg = space.triton_fallback(cfg, s) if family == "fwd" else space.bwd_triton_fallback(cfg)
        assert all(v in sp[k] for k, v in dataclasses.asdict(cfg).items()), f"{cfg} outside {sp}"


def test_space_is_every_field_in_order_and_enumerates_the_product():
    sp = space.search_space(BwdConfig, "bwd", "sm90")
    assert list(sp) == [f.name for f in dataclasses.fields(BwdConfig)]
    cfgs = space.enumerate_space(FwdConfig, "fwd", spec(), space.check_fwd)
    n = 1
    for c in space.search_space(FwdConfig, "fwd", "sm90").values():
        n *= len(c)
    assert len(cfgs) == n and len({c for c, _ in cfgs}) == n
    valid = [c for c, why in cfgs if why is None]
    assert 0 < len(valid) < n and all(space.check_fwd(spec(), c) is None for c in valid)


def test_the_families_table_uses_check_bwd():
    assert FAMILIES["bwd"].check is space.check_bwd and FAMILIES["fwd"].check is space.check_fwd


def test_a_new_field_plugs_in(monkeypatch):
    """A field added to a config dataclass (as the Hopper knobs were): with a default it is
    searched over that default only; listed in the space (here per target) it is searched; without
    either the space says which field lacks candidates."""
    @dataclasses.dataclass(frozen=True)
    class Fwd2(FwdConfig):
        knob: bool = False

    monkeypatch.setitem(fwd_family.TARGET_SPACES, "sm90", {})
    assert space.search_space(Fwd2, "fwd", "sm90")["knob"] == (False,)
    monkeypatch.setitem(fwd_family.TARGET_SPACES, "sm90", {"knob": (False, True)})
    assert space.search_space(Fwd2, "fwd", "sm90")["knob"] == (False, True)
    assert space.search_space(Fwd2, "fwd", "sm80")["knob"] == (False,)
    base = {"block_m": 64, "block_n": 64, "num_warps": 4, "num_stages": 2}
    assert space.config_from_dict(Fwd2, base) == Fwd2(**base, knob=False)
    with pytest.raises(ValueError, match="does not have: knob"):
        space.search_space(FwdConfig, "fwd", "sm90")

    @dataclasses.dataclass(frozen=True)
    class Fwd4(FwdConfig):
        stages2: int = dataclasses.field(kw_only=True)

    monkeypatch.setitem(fwd_family.TARGET_SPACES, "sm90", {})
    with pytest.raises(ValueError, match="stages2: no candidate values"):
        space.search_space(Fwd4, "fwd", "sm90")


def test_config_from_dict_names_bad_fields():
    with pytest.raises(ValueError, match="no field.*bogus"):
        space.config_from_dict(FwdConfig, {"block_m": 64, "bogus": 1})
    with pytest.raises(ValueError, match="FwdConfig"):
        space.config_from_dict(FwdConfig, {"block_m": 64})
    cfg = BwdConfig(32, 64, 4, 1, 64, 32, 4, 1)
    assert space.config_from_dict(BwdConfig, dataclasses.asdict(cfg)) == cfg


def test_sm90_default_is_the_warp_specialized_forward_where_it_exists():
    """Dense sm90 calls of head dim 64 / 128 / 192 / 256 without softcapping take the Gluon kernel
    (FwdConfig.consumers; hd192 / hd256 on 64-key blocks: 128-key ones do not fit; causal hd256
    with two mirrored query tiles per program); packed hd128 documents take it as one persistent
    program per SM walking mirrored pairs (WS_DOCS; the launcher turns uneven documents to the
    Triton kernel), other packed head dims the Triton kernel; softcapping, other head dims and
    sm80 do not."""
    for d in (64, 128, 192, 256):
        want = space.WS_DEFAULT if d <= 128 else space.WS_DEFAULT_WIDE
        for mask in ("none", "causal", "sliding_window"):
            s = KernelSpec("fwd", "bf16", "sm90", d, d, 4, mask)
            paired = dataclasses.replace(want, pair_tiles=d == 256 and mask == "causal")
            assert space.default_fwd_config(s, "cuda", 4096) == paired, (d, mask)
            assert space.check_fwd(s, want) is None
    assert space.check_fwd(KernelSpec("fwd", "bf16", "sm90", 256, 256, 1, "causal"),
                           space.WS_DEFAULT).startswith("needs ~")
    docs = KernelSpec("fwd", "bf16", "sm90", 128, 128, 4, "causal", varlen=True)
    assert space.check_fwd(docs, space.WS_DEFAULT) is None
    assert space.default_fwd_config(docs, "cuda", 4096) == space.WS_DOCS
    assert space.WS_DOCS.persistent == 1 and space.WS_DOCS.pair_tiles
    for d in (64, 256):  # the kernel exists there (a tuning choice); the Triton one is the default
        docs = KernelSpec("fwd", "bf16", "sm90", d, d, 4, "causal", varlen=True)
        assert space.check_fwd(docs, space.WS_DEFAULT if d == 64 else space.WS_DEFAULT_WIDE) is None
        assert space.default_fwd_config(docs, "cuda", 4096).consumers == 0, d
    # one program per SM is the Gluon kernel's only persistent form, over packed documents only
    docs = KernelSpec("fwd", "bf16", "sm90", 128, 128, 4, "causal", varlen=True)
    assert "persistent is 0" in space.check_fwd(docs, dataclasses.replace(space.WS_DOCS, persistent=2))
    assert "packed-documents" in space.check_fwd(spec(d=128), dataclasses.replace(space.WS_DEFAULT, persistent=1))
    others = [KernelSpec("fwd", "bf16", "sm90", 128, 128, 4, "causal", softcap=True),
              KernelSpec("fwd", "bf16", "sm90", 96, 96, 1, "causal"),
              KernelSpec("fwd", "bf16", "sm90", 80, 80, 1, "causal"),
              KernelSpec("fwd", "bf16", "sm80", 128, 128, 1, "causal")]
    for s in others:
        assert space.default_fwd_config(s, "cuda", 4096).consumers == 0, s
        assert space.check_fwd(s, space.WS_DEFAULT).startswith("consumers"), s
    # the CPU (interpreter) default never asks for it
    assert space.default_fwd_config(spec(d=128), "cpu", 4096).consumers == 0


@pytest.mark.parametrize("change, reason", [
    (dict(consumers=3), "consumers is 0"),
    (dict(tma=False), "consumers needs tma"),
    (dict(block_m=64), "consumers: each consumer is one warp group"),
    (dict(num_warps=8), "consumers: each consumer is one warp group"),
    (dict(block_n=32), "consumers: block_n is 64 or 128"),
    (dict(q_regs=True), "consumers: q_regs"),
    (dict(lazy_rescale=True), "consumers: q_regs"),
    (dict(num_stages=4), "needs ~"),  # Q + four 128-key K / V stages: over the shared memory
])
def test_check_fwd_warp_specialized_forward(change, reason):
    cfg = dataclasses.replace(space.WS_DEFAULT, **change)
    assert space.check_fwd(spec(d=128), cfg).startswith(reason), space.check_fwd(spec(d=128), cfg)


def test_pair_tiles_is_a_gluon_forward_knob():
    assert space.check_fwd(spec(d=128), dataclasses.replace(space.WS_DEFAULT, pair_tiles=True)) is None
    one = dataclasses.replace(space.WS_DEFAULT, consumers=1, block_m=64, block_n=64)  # two programs per SM
    assert space.check_fwd(spec(d=128), one) is None
    assert space.check_fwd(spec(d=128), dataclasses.replace(one, block_m=128)).startswith("consumers: each")
    triton = FwdConfig(64, 64, 4, 3, tma=True, pair_tiles=True)
    assert space.check_fwd(spec(d=128), triton).startswith("pair_tiles exists in the warp-specialized")
    assert space.triton_fallback(dataclasses.replace(space.WS_DEFAULT, pair_tiles=True)).pair_tiles is False


def test_triton_fallback_of_the_warp_specialized_forward():
    fb = space.triton_fallback(space.WS_DEFAULT)
    assert fb.consumers == 0 and space.check_fwd(spec(d=128), fb) is None
    plain = FwdConfig(64, 64, 4, 3, tma=True)
    assert space.triton_fallback(plain) is plain


def test_sm90_default_backward_is_the_warp_specialized_one_where_it_exists():
    """sm90 backward calls of head dim 64 / 80 / 96 / 128 / 192 / 256 without softcapping, dense or
    packed documents, take the Gluon passes (BwdConfig.consumers, dq_consumers; hd64 keeps the
    Triton dQ pass, which won there; hd192 the dK/dV pass with split roles beside the Gluon dQ pass,
    hd256 beside the Triton dQ pass); softcapping, other head dims, sm80 and the CPU do not."""
    two_tile = ((80, space.WS_BWD_DEFAULT), (96, space.WS_BWD_DEFAULT), (192, space.WS_BWD_ROLES_DQ))
    for d, want in ((64, space.WS_BWD_DEFAULT_HD64), (128, space.WS_BWD_DEFAULT), (256, space.WS_BWD_ROLES),
                    *(x for x in two_tile if x[0] in space.WS_BWD_TWO_TILE_DEFAULT)):
        for mask in ("none", "causal", "sliding_window"):
            s = KernelSpec("bwd", "bf16", "sm90", d, d, 4, mask)
            assert space.default_bwd_config(s, "cuda", window=1024) == want, (d, mask)
            assert space.check_bwd(s, want) is None
    assert space.WS_BWD_DEFAULT_HD64.dq_consumers == 0 and space.WS_BWD_DEFAULT.dq_consumers == 2
    docs = KernelSpec("bwd", "bf16", "sm90", 128, 128, 4, "causal", varlen=True)
    assert space.default_bwd_config(docs, "cuda") == space.WS_BWD_DEFAULT  # packed documents too
    assert space.default_bwd_config(docs.replace(head_dim_qk=256, head_dim_v=256), "cuda") == space.WS_BWD_ROLES
    assert space.WS_BWD_ROLES.roles and space.WS_BWD_ROLES.dq_consumers == 0
    assert space.WS_BWD_ROLES_DQ.roles and space.WS_BWD_ROLES_DQ.dq_consumers == 2
    assert set(space.WS_BWD_TWO_TILE_DEFAULT) == {80, 96, 192}
    hd192_docs = docs.replace(head_dim_qk=192, head_dim_v=192)  # packed documents keep the Triton passes there
    assert not space.default_bwd_config(hd192_docs, "cuda").consumers
    hd192_expr = KernelSpec("bwd", "bf16", "sm90", 192, 192, 1, "none", mask_expr="q_idx >= kv_idx")
    assert not space.default_bwd_config(hd192_expr, "cuda").consumers  # GPU-tested on built-in masks only
    for d, want in two_tile:  # valid there whether or not they are the default
        assert space.check_bwd(KernelSpec("bwd", "bf16", "sm90", d, d, 4, "causal"), want) is None, d
    for s in (KernelSpec("bwd", "bf16", "sm90", 128, 128, 4, "causal", softcap=True),
              KernelSpec("bwd", "bf16", "sm90", 112, 112, 1, "causal"),
              KernelSpec("bwd", "bf16", "sm90", 160, 160, 1, "causal"),
              KernelSpec("bwd", "bf16", "sm80", 128, 128, 1, "causal")):
        cfg = space.default_bwd_config(s, "cuda")
        assert cfg.consumers == cfg.dq_consumers == 0, s
        want = "tma exists" if s.target == "sm80" else "consumers / dq_consumers"
        assert space.check_bwd(s, space.WS_BWD_DEFAULT).startswith(want), s
    assert space.default_bwd_config(spec(d=128).replace(family="bwd"), "cpu").consumers == 0


@pytest.mark.parametrize("change, reason", [
    (dict(consumers=3), "consumers / dq_consumers are 0"),
    (dict(tma=False), "consumers / dq_consumers need tma"),
    (dict(atomic_dq=True), "consumers / dq_consumers need tma"),
    (dict(split_dkdv=True), "consumers: the Gluon dK/dV pass computes dK and dV in one launch"),
    (dict(block_n=64), "consumers: each consumer is one warp group of 64 keys"),
    (dict(num_warps=8), "consumers: each consumer is one warp group of 64 keys"),
    (dict(block_m=32), "consumers: block_m"),
    (dict(dq_block_m=64), "dq_consumers: each consumer is one warp group of 64 query rows"),
    (dict(dq_num_warps=8), "dq_consumers: each consumer is one warp group of 64 query rows"),
    (dict(dq_block_n=32), "dq_consumers: dq_block_n is 64"),
    (dict(dq_regs=True), "dq_consumers: dq_block_n is 64"),
    (dict(dq_num_stages=6), "dQ: needs ~"),  # Q / dO of 128 rows + six 64-key K / V stages
    (dict(dq_num_stages=1), "dq_consumers: dq_num_stages is at least 2"),  # deadlocked on the H200
])
def test_check_bwd_warp_specialized_backward(change, reason):
    s = KernelSpec("bwd", "bf16", "sm90", 128, 128, 4, "causal")
    cfg = dataclasses.replace(space.WS_BWD_DEFAULT, **change)
    assert (space.check_bwd(s, cfg) or "").startswith(reason), space.check_bwd(s, cfg)


@pytest.mark.parametrize("d, change, reason", [
    (256, dict(roles=False, block_n=128), "consumers: past head dim 128 the Gluon dK/dV pass needs roles"),
    (256, dict(block_n=128), "roles: both consumers own the program's 64 keys"),
    (256, dict(num_warps=8), "roles: both consumers own the program's 64 keys"),
    (256, dict(dq_consumers=2, dq_block_m=128), "dq_consumers: the Gluon dQ pass's Q, dO and K / V ring do not fit"),
    (192, dict(dq_consumers=2, dq_block_m=128), None),  # Q and dO read from shared memory there
    (192, dict(dq_consumers=2, dq_block_m=128, dq_num_stages=3), "dQ: needs ~"),
    (256, dict(num_stages=3), "dK/dV: needs ~"),  # K, V, P^T and three 64-row Q / dO slots
    (128, dict(consumers=0, dq_consumers=0), "roles splits the Gluon dK/dV pass's work"),
    (128, dict(), None),  # a knob there too (it loses to the default on hd128)
])
def test_check_bwd_roles(d, change, reason):
    """BwdConfig.roles: the only Gluon dK/dV pass past hd128 (its two consumers own the same 64
    keys), and the shared-memory model counts its P^T tile: two 64-row stages fit at hd256
    (K, V, 2 x Q / dO, fp32 P^T: 213504 B; the H200 compile asked for 214480), three do not."""
    s = KernelSpec("bwd", "bf16", "sm90", d, d, 1, "causal")
    cfg = dataclasses.replace(space.WS_BWD_ROLES, **change)
    got = space.check_bwd(s, cfg)
    assert (got or "").startswith(reason) if reason else got is None, got
    assert space.bwd_smem_bytes(KernelSpec("bwd", "bf16", "sm90", 256, 256, 1, "causal"), space.WS_BWD_ROLES)[0] == 213504


def test_triton_fallback_of_the_warp_specialized_backward():
    s = KernelSpec("bwd", "bf16", "sm90", 128, 128, 4, "causal")
    fb = space.bwd_triton_fallback(space.WS_BWD_DEFAULT)
    assert fb.consumers == fb.dq_consumers == 0 and space.check_bwd(s, fb) is None
    assert (fb.block_n, fb.dq_block_m, fb.dq_num_warps) == (64, 128, 8)
    only_dq = space.bwd_triton_fallback(space.WS_BWD_DEFAULT, dkdv=False)
    assert only_dq.consumers == 2 and only_dq.dq_consumers == 0 and space.check_bwd(s, only_dq) is None
    plain = BwdConfig(64, 64, 4, 2, 128, 64, 8, 3, tma=True)
    assert space.bwd_triton_fallback(plain) is plain
    # split roles fall back to the split Triton dK / dV launches (one accumulator each), hd256's
    wide = space.bwd_triton_fallback(space.WS_BWD_ROLES)
    assert wide == space.default_bwd_config(KernelSpec("bwd", "bf16", "sm90", 256, 256, 1, "causal", softcap=True))
    # hd64's 128-row ring slots are the Gluon pass's: its Triton fallback (atomic dQ, 64-bit
    # offsets, packed documents with ATTNGEN_KERNEL_DESCRIPTORS=0) takes the Triton hd64 default's
    # 64 x 64 tiles, as the 64-row form it replaced did
    s64 = KernelSpec("bwd", "bf16", "sm90", 64, 64, 4, "causal", softcap=True)  # softcapping: the Triton table
    narrow = space.bwd_triton_fallback(space.WS_BWD_DEFAULT_HD64)
    assert narrow == space.bwd_triton_fallback(space.WS_BWD_DKDV_M64) == space.default_bwd_config(s64)
    assert (narrow.block_m, narrow.block_n) == (64, 64) and space.check_bwd(s64, narrow) is None
