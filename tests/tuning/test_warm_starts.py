"""A study's first proposals (attngen.tuning.study.warm_starts): the default config, then the
winners of the nearest buckets tuned for its kernel and class; a GPU model's class (h200) also
starts from its parent's (h100) winners, the same bucket's first."""

from __future__ import annotations

import dataclasses

from attngen.buckets import parse_bucket
from attngen.db import store as dbs
from attngen.spec import KernelSpec
from attngen.tuning.sampling import valid_space
from attngen.tuning.study import warm_starts
from attngen.tuning.targets import Target, default_config

SPEC = KernelSpec("fwd", "bf16", "sm90", 128, 128, 4, "causal")
DEVICE = dict(device_class="h100", gpu_name="NVIDIA H100 80GB HBM3", capability="9.0", driver="570.00",
              cuda_version="12.8", torch_version="2.11.0", triton_version="3.6.0")


def _store(tmp_path, rows):
    """rows: (device class, bucket key, config dict), each a winner of SPEC under kernel hash h1"""
    st = dbs.Store(str(tmp_path / "t.sqlite"), "create")
    with st.session() as s:
        dev = dbs.find_or_add_device(s, DEVICE)
        k = dbs.find_or_add_kernel(s, SPEC.uri, "h1", "fwd", {})
        for cls, key, cfg in rows:
            b = dbs.find_or_add_bucket(s, key)
            t = dbs.add_trial(s, kernel=k, device=dev, bucket=b, config=cfg, status="ok", shape={},
                              time_ms=1.0, tflops=1.0)
            assert dbs.offer_winner(s, t, cls, 2.0, 0.5)
    return st


def test_an_h200_study_starts_from_h100s_winner_of_its_bucket(tmp_path):
    target = Target(None, SPEC, parse_bucket("q4096_k4096_bh32"), "h1", "h200")
    dcfg = default_config(SPEC, "cuda", 4096)
    others = [c for c in valid_space(SPEC, target.space).configs() if c != dataclasses.asdict(dcfg)]
    same_h100, near_h200, far_h100, other_kernel = others[:4]
    st = _store(tmp_path, [("h100", "q4096_k4096_bh32", same_h100), ("h200", "q8192_k8192_bh32", near_h200),
                           ("h100", "q1024_k1024_bh32", far_h100), ("a100", "q4096_k4096_bh32", other_kernel)])
    with st:
        starts = warm_starts(st, target, dcfg, target.space, n=3)
        assert starts == [dataclasses.asdict(dcfg), same_h100, near_h200, far_h100]
        # an h100 study never starts from h200's winners, nor from its own bucket's winner
        h100 = dataclasses.replace(target, device_class="h100")
        assert warm_starts(st, h100, dcfg, target.space, n=3) == [dataclasses.asdict(dcfg), far_h100]
