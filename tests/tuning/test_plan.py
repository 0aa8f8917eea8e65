"""What `attngen tune` plans to tune: default buckets per spec entry, kernels per device profile,
family and --kernels filter, one study name per (kernel, template, device class, bucket, space);
and the device-profile check."""

from __future__ import annotations

import pytest

from attngen.env import REPO_ROOT
from attngen.spec import KernelSpec, load_spec
from attngen import configs as space
from attngen.families import fwd as fwd_family
from attngen.tuning.targets import (TuneError, TuneOptions, default_buckets, in_space, pin, plan,
                                    space_for, valid_count)
from attngen.buckets import parse_bucket
from attngen.devices import DeviceInfo, check_profile
from attngen.configs import FwdConfig

SPECS = REPO_ROOT / "specs"


def test_default_buckets_per_entry():
    e = next(x for x in load_spec(SPECS / "llama.yaml").entries if x.name == "llama3_8b")
    keys = [b.key for b in default_buckets(e)]
    assert len(keys) == 10 and "q1024_k1024_bh32" in keys and "q16384_k16384_bh128" in keys
    assert not any(b.decode for b in default_buckets(e))


def test_plan_filters_by_profile_family_and_glob():
    targets = plan(TuneOptions(device="h100", specs=[str(SPECS)]))
    assert targets and all(t.spec.target == "sm90" and t.device_class == "h100" for t in targets)
    assert {t.spec.family for t in targets} == {"fwd", "bwd", "decode", "fwd_fp8", "prefill_paged"}
    # the decode family tunes on decode buckets (one query token), the others never do
    assert all(t.bucket.decode == (t.spec.family == "decode") for t in targets)
    assert not any(t.spec.uri.endswith("hd80_gqa2_full_sm80") for t in targets)  # encoder: sm80 only
    a100 = plan(TuneOptions(device="a100", specs=[str(SPECS / "phi3.yaml")], families=("fwd",)))
    assert {t.spec.uri for t in a100} == {"attn_fwd_bf16_hd96_gqa1_causal_sm80", "attn_fwd_fp16_hd96_gqa1_causal_sm80",
                                          "attn_fwd_bf16_hd80_gqa2_full_sm80", "attn_fwd_fp16_hd80_gqa2_full_sm80"}
    some = plan(TuneOptions(device="h100", specs=[str(SPECS)], kernels="attn_bwd_bf16_*",
                                        shapes=[parse_bucket("q4096_k4096_bh64")]))
    assert all(t.spec.uri.startswith("attn_bwd_bf16_") and t.bucket.key == "q4096_k4096_bh64" for t in some)
    names = [t.study_name for t in targets]
    assert len(set(names)) == len(names)


def test_study_name_follows_template_and_space(monkeypatch):
    (t,) = plan(TuneOptions(device="h100", specs=[str(SPECS / "llama.yaml")],
                                        kernels="attn_fwd_bf16_hd128_gqa4_causal_sm90",
                                        shapes=[parse_bucket("q4096_k4096_bh64")]))
    uri, h, cls, bucket, sp = t.study_name.split(".")
    assert (uri, h, cls, bucket) == (t.spec.uri, t.kernel_hash, "h100", "q4096_k4096_bh64")
    monkeypatch.setitem(fwd_family.TARGET_SPACES, "sm90", {"num_warps": (4,)})
    assert t.study_name.split(".")[4] != sp


def test_nothing_to_tune_and_bad_spec_are_tune_errors(tmp_path):
    with pytest.raises(TuneError, match="nothing to tune"):
        plan(TuneOptions(device="h100", specs=[str(SPECS)], kernels="nope*"))
    (tmp_path / "bad.yaml").write_text("kernels: 3\n")
    with pytest.raises(TuneError, match="bad.yaml"):
        plan(TuneOptions(device="h100", specs=[str(tmp_path / "bad.yaml")]))


@pytest.mark.parametrize("cap, profile, ok", [((9, 0), "h100", True), ((8, 0), "a100", True),
                                               ((8, 0), "h100", False), ((8, 9), "a100", False),
                                               ((10, 0), "h100", False)])
def test_check_profile(cap, profile, ok):
    info = DeviceInfo("GPU X", cap, "1", "12", "2", "3", index=1)
    why = check_profile(info, profile)
    assert (why is None) == ok
    if not ok:
        assert why.startswith(f"GPU 1 is GPU X (sm{cap[0]}{cap[1]}") and f"--device {profile} needs" in why


def test_fix_pins_fields_of_the_kernels_that_have_them():
    opts = dict(device="h100", specs=[str(SPECS / "llama.yaml")], kernels="attn_*_bf16_hd128_gqa4_causal_sm90",
                shapes=[parse_bucket("q4096_k4096_bh64")])
    free = {t.spec.family: t for t in plan(TuneOptions(**opts))}
    pinned = {t.spec.family: t for t in plan(TuneOptions(**opts, fixed={"atomic_dq": "false"}))}
    assert pinned["bwd"].space["atomic_dq"] == (False,) and free["bwd"].space["atomic_dq"] == (False, True)
    assert pinned["bwd"].study_name != free["bwd"].study_name  # a pinned space is its own study
    assert pinned["fwd"].study_name == free["fwd"].study_name  # fwd has no atomic_dq: untouched
    assert valid_count(pinned["bwd"].spec, pinned["bwd"].space) < valid_count(free["bwd"].spec)
    with pytest.raises(TuneError, match="no kernel to tune has a config field 'atomic'"):
        plan(TuneOptions(**opts, fixed={"atomic": "false"}))
    with pytest.raises(TuneError, match="expected true or false"):
        plan(TuneOptions(**opts, fixed={"atomic_dq": "no"}))
    assert pin(pinned["fwd"].spec, {"block_m": "64"}) == {"block_m": 64}


def test_space_drops_values_no_valid_config_takes():
    """The Gluon kernels' knobs are in the sm90 space where those kernels exist (so the tuner
    measures the kernels that serve by default) and dropped where no valid config takes them."""
    from attngen.configs import WS_DEFAULT

    d128 = KernelSpec("fwd", "bf16", "sm90", 128, 128, 4, "causal")
    d96 = KernelSpec("fwd", "bf16", "sm90", 96, 96, 1, "causal")
    sp128, sp96 = space_for(d128), space_for(d96)
    assert sp128["consumers"] == (0, 1, 2) and sp128["pair_tiles"] == (False, True)
    assert in_space(WS_DEFAULT.as_dict(), sp128)
    assert sp96["consumers"] == (0,) and sp96["pair_tiles"] == (False,)
    assert valid_count(d96, sp96) == valid_count(d96, space.search_space(
        FwdConfig, "fwd", "sm90")), "dropping never-valid values lost valid configs"
    bwd = KernelSpec("bwd", "bf16", "sm90", 128, 128, 4, "causal")
    assert space_for(bwd)["dq_consumers"] == (0, 2)
    assert space_for(bwd, {"consumers": 2})["split_dkdv"] == (False,)


def test_space_drops_only_the_values_no_valid_config_takes():
    """space_for's validity pass (targets._drop_never_valid): a value no valid config of the kernel
    takes leaves the space, every other stays, and a space with no valid config at all comes back
    as it was (the study reports it); the result is the brute-force scan's."""
    import itertools

    from attngen.families import family as family_of
    from attngen.tuning.targets import _drop_never_valid

    spec = next(s for e in load_spec(SPECS / "llama.yaml").entries for s in e.kernel_specs()
                if s.family == "decode" and s.target == "sm90")
    fam = family_of("decode")
    base = space.search_space(fam.config, "decode", "sm90")
    items = tuple((k, v + (999,) if k == "num_splits" else v) for k, v in base.items())  # 999: never valid
    kept = dict(_drop_never_valid.__wrapped__(spec, items))
    names = [k for k, _ in items]
    valid = [vals for vals in itertools.product(*(v for _, v in items))
             if fam.check(spec, fam.config(**dict(zip(names, vals)))) is None]
    assert kept == {k: tuple(c for c in v if any(vals[i] == c for vals in valid))
                    for i, (k, v) in enumerate(items)}
    assert 999 not in kept["num_splits"] and kept["num_splits"] == base["num_splits"]
    never = tuple((k, (999,) if k == "num_splits" else v) for k, v in base.items())
    assert _drop_never_valid.__wrapped__(spec, never) == never
