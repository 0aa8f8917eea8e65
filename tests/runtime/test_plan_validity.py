"""Every config a plan can run passes the validity filter the tuner uses, on the sm90 family (meta
tensors, an H200 stand-in: tests/runtime/test_grid_limits.py's fixture): every (shape class, path)
the plans produce -- host-bound shapes downgraded to the pointer kernels, long dense calls on the
TMA / Gluon kernels, packed documents even and uneven, calls whose tensors the copy engine cannot
address -- over every head-dim class, mask and softcap. The launchers refuse a config the filter
rejects (configs.require_valid), so the padded-head-dim bug (a host-bound plan kept q_regs on the
pointer kernel) cannot come back unnoticed."""

from __future__ import annotations

import itertools

import pytest
import torch

from attngen.runtime import api, dispatch

from attngen.runtime import validate
from attngen import configs as space
from attngen.configs import BwdConfig, FwdConfig, InvalidConfig
from tests.runtime.test_grid_limits import h200, kernel_cache, meta  # noqa: F401 (fixtures)
from tests.gpu.test_gpu_grid import CLASSES

# name -> dense (B, Hq, Hkv, Sq, Sk) or packed (documents, longest, tokens, Hq, Hkv)
SHAPES = {"host-bound": ("dense", (2, 6, 2, 113, 203)), "long": ("dense", (2, 16, 4, 4096, 4096)),
          "docs-even": ("packed", (4, 1024, 4096, 16, 4)), "docs-uneven": ("packed", (16, 2000, 8000, 16, 4))}
MASKS = [(True, (-1, -1), 0.0), (False, (-1, -1), 30.0), (False, (100, 0), 0.0)]


def plans(kind: str, dims, hd: int, causal: bool, window, softcap: float, misaligned: bool = False):
    if kind == "dense":
        B, hq, hkv, sq, sk = dims
        q, k, v = meta(B, hq, sq, hd), meta(B, hkv, sk, hd), meta(B, hkv, sk, hd)
        layout, extra = "bhsd", ()
    else:
        docs, n, t, hq, hkv = dims  # uneven: the mean document far below the longest
        q, k, v = meta(t, hq, hd), meta(t, hkv, hd), meta(t, hkv, hd)
        cu = meta(docs + 1, dtype=torch.int32)
        layout, extra = "packed", (cu, cu, n, n)
    opts = validate.make_options(hd, causal, window, softcap, None, "bottom_right", layout)
    fwd = api.ForwardPlan(q, k, v, opts, *extra)
    out, lse = fwd.empty()
    bwd = api.BackwardPlan(torch.empty_like(out), q, k, v, out, lse, opts, False, *extra,
                           pointer_only=misaligned)
    if misaligned:
        fwd = fwd.portable()
    return fwd, bwd


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("hd", sorted(CLASSES))
def test_every_plan_config_passes_the_filter(h200, shape, hd):
    kind, dims = SHAPES[shape]
    for (causal, window, softcap), misaligned in itertools.product(MASKS, (False, True)):
        fwd, bwd = plans(kind, dims, hd, causal, window, softcap, misaligned)
        assert space.check_fwd(fwd.spec, fwd.config) is None, (shape, hd, fwd.config)
        assert space.check_bwd(bwd.spec, bwd.config) is None, (shape, hd, bwd.config)
        names = [n for n, _ in api.plan_launches(fwd)] + [n for n, _ in api.plan_launches(bwd)]
        if misaligned:  # the copy engine cannot take the call: pointer kernels only
            assert names[0] == "_attn_fwd" and "_attn_bwd_dkdv" in names, names
        if shape == "host-bound":  # the downgrade: pointer kernels, no TMA / Gluon knob left on
            assert names[0] == "_attn_fwd", names
            assert not (fwd.config.tma or fwd.config.q_regs or fwd.config.consumers), fwd.config
            assert not (bwd.config.tma or bwd.config.split_dkdv or bwd.config.dq_regs
                        or bwd.config.consumers or bwd.config.dq_consumers), bwd.config


def test_the_padded_head_dim_plan_of_the_issue(h200):
    """bf16 hd40 Sq 113 Sk 203 causal: the default (64x64 TMA tiles, q_regs) downgraded to the
    pointer kernel with q_regs off."""
    fwd, _ = plans("dense", (2, 6, 6, 113, 203), 40, True, (-1, -1), 0.0)
    assert api.plan_launches(fwd)[0][0] == "_attn_fwd"
    assert fwd.config == FwdConfig(64, 64, 4, 3) and "host-bound" in fwd.config_source


def test_launchers_refuse_a_config_the_filter_rejects(h200):
    """The choke point: a pointer-kernel config with q_regs (what the host-bound downgrade used to
    build) never reaches a launch, whoever builds it."""
    q = meta(2, 6, 113, 40)
    opts = validate.make_options(40, True, (-1, -1), 0.0, None, "bottom_right", "bhsd")
    plan = api.ForwardPlan(q, q, q, opts)
    out, lse = plan.empty()
    bad = FwdConfig(64, 64, 4, 3, q_regs=True)
    with pytest.raises(InvalidConfig, match="q_regs"):
        api.fwd_launches(plan.module, plan.spec, q, q, q, out, lse, opts.mask_args, bad)
    bwd = api.BackwardPlan(torch.empty_like(out), q, q, q, out, lse, opts, False)
    with pytest.raises(InvalidConfig, match="split_dkdv"):
        api.bwd_launches(bwd.module, bwd.spec, q, q, q, out, out, lse, lse, q, q, q, opts.mask_args,
                         BwdConfig(64, 64, 4, 2, 64, 64, 4, 2, split_dkdv=True), False)


def test_forced_config_is_checked_and_keyed(h200):
    """dispatch.forced_config: the forced config runs (no host-bound downgrade), an invalid one is
    a clear error, and plans made under it are not reused outside it."""
    q = meta(2, 6, 113, 64)
    opts = validate.make_options(64, True, (-1, -1), 0.0, None, "bottom_right", "bhsd")
    tma = FwdConfig(64, 64, 4, 2, tma=True, q_regs=True)
    with dispatch.forced_config(fwd=tma):
        plan = api.ForwardPlan(q, q, q, opts)
        assert plan.config == tma and plan.config_source == "forced"
        assert api.plan_launches(plan)[0][0] == "_attn_fwd_tma"
        inner = dispatch.override()
    assert dispatch.override() is None and inner is not None
    with dispatch.forced_config(fwd=FwdConfig(64, 64, 4, 2, consumers=2)):
        with pytest.raises(ValueError, match="consumers"):
            api.ForwardPlan(meta(2, 6, 113, 40), meta(2, 6, 113, 40), meta(2, 6, 113, 40),
                            validate.make_options(40, True, (-1, -1), 0.0, None, "bottom_right", "bhsd"))
    with pytest.raises(ValueError, match="BwdConfig"):
        with dispatch.forced_config(bwd=tma):
            pass


@pytest.mark.parametrize("family", ["fwd", "bwd"])
def test_every_default_and_its_pointer_fallback_pass_the_filter(family):
    """The default tables of both targets, for every head dim 8..256 (dense and packed, with and
    without softcapping, short and long queries), and the pointer-kernel config each falls back
    to, pass the validity filter (the choke point caught sm90's hd168 / hd176, one padded
    256-column tile, whose default needed 256 KB of shared memory, and sm80's hd192 / hd256
    default, 192 KB where an sm80 GPU has 163 KB)."""
    from attngen.spec import KernelSpec

    check = space.check_fwd if family == "fwd" else space.check_bwd
    for d, varlen, softcap, mask, target in itertools.product(
            range(8, 257), (False, True), (False, True), ("none", "causal", "sliding_window"), ("sm80", "sm90")):
        s = KernelSpec(family, "bf16", target, d, d, 1, mask, softcap, varlen)
        for sq in (128, 4096):
            if family == "fwd":
                cfg = space.default_fwd_config(s, "cuda", sq)
                fallback = space.pointer_fwd_config(cfg, s)
            else:
                cfg = space.default_bwd_config(s, "cuda", 1024 if mask == "sliding_window" else None)
                fallback = space.pointer_bwd_config(cfg)
            assert check(s, cfg) is None, (s.uri, cfg, check(s, cfg))
            assert check(s, fallback) is None, (s.uri, fallback, check(s, fallback))


def test_explain_names_the_configs_that_run(h200):
    """explain() of the issue's host-bound hd40 call on an H200: the pointer kernels' configs,
    forward and backward, with no TMA or Gluon knob left on."""
    import attngen

    q, k = meta(2, 6, 113, 40), meta(2, 6, 203, 40)
    info = attngen.explain(q, k, k, causal=True)
    assert info["launches"][0]["entry"] == "_attn_fwd" and not info["config"]["q_regs"], info
    bwd = info["backward"]
    assert "host-bound" in bwd["config_source"], bwd
    assert not (bwd["config"]["tma"] or bwd["config"]["split_dkdv"] or bwd["config"]["dq_regs"]), bwd
