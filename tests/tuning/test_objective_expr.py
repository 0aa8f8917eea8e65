"""The tuner on kernels with expressions and learned sinks (CPU, Triton's interpreter): the shipped
expression specs' forward and backward objectives make the kernels' parameter tensors and sinks,
check a config against a float64 reference that evaluates the kernel's own expressions, and fail a
config whose result misses them."""

from __future__ import annotations

import dataclasses

import pytest

from attngen.buckets import parse_bucket
from attngen.configs import BwdConfig, FwdConfig
from attngen.tuning import objective as obj
from tests.tuning.test_objective import entry_and_spec, fixed_timer

CASES = {  # spec file, entry: what the expression kernel takes
    "t5": ("t5_base.yaml", "t5_base_encoder"),  # a learnable [h, 32] bias table (fp32)
    "alibi": ("bloom_alibi.yaml", None),  # a [h] slope parameter
    "prefix_lm": ("gemma3_prefix_lm.yaml", "gemma3_4b_prefix_lm"),  # an int32 [b] prefix length
    "gpt_oss": ("gpt_oss_20b.yaml", None),  # learned sinks
}


def objective(case: str, family: str, seqlen_q: int = 40, seqlen_k: int = 72):
    """The objective of the case's bf16 sm90 kernel on an odd shape (the bucket's problem with its
    lengths replaced)."""
    from attngen.env import REPO_ROOT
    from attngen.spec import load_spec

    file, name = CASES[case]
    name = name or load_spec(REPO_ROOT / "specs" / file).entries[0].name
    e, s = entry_and_spec(file, name, family=family, dtype="bf16", target="sm90")
    assert s.has_expr, s.uri
    p = obj.problem_for(e, s, parse_bucket("q1_k64_bh4" if family == "decode" else "q64_k64_bh4"))
    p = dataclasses.replace(p, seqlen_q=seqlen_q, seqlen_k=seqlen_k)
    return obj.Objective(s, p, "cpu", timer=fixed_timer(1.0))


@pytest.mark.parametrize("case", sorted(CASES))
def test_forward_expression_trial(case):
    o = objective(case, "fwd")
    t = o.sets[0]
    names = {n for n in t if n.startswith("XP_") or n == "Sinks"}
    assert names == {f"XP_{d.name}" for d in o.spec.params} | ({"Sinks"} if o.spec.sinks else set())
    assert o.run(FwdConfig(32, 32, 4, 2)).status == "ok"
    # a parameter changed after the reference was made: the kernel's result no longer matches it
    x = t[sorted(names)[0]]
    x.copy_(x + 1 if x.is_floating_point() else x + o.problem.seqlen_k // 2)  # prefixes past some queries
    o.hooks.__dict__.pop("_replays", None)
    bad = o.run(FwdConfig(32, 32, 4, 2))
    assert bad.status == "failed" and bad.error.startswith("wrong result:"), bad


@pytest.mark.parametrize("case", ["t5", "gpt_oss"])
def test_backward_expression_trial(case):
    o = objective(case, "bwd", 33, 47)
    assert o.run(BwdConfig(32, 32, 4, 2, 32, 32, 4, 2)).status == "ok"
    t = o.sets[0]
    t["dout"].mul_(-1)  # the reference's dO no longer the kernel's
    o.hooks.__dict__.pop("_replays", None)
    assert o.run(BwdConfig(32, 32, 4, 2, 32, 32, 4, 2)).status == "failed"


@pytest.mark.parametrize("case", ["gpt_oss", "alibi"])
def test_decode_expression_trial(case):
    # the decode family's objective: both cache layouts, the kernel's parameters / sinks, checked
    # against the expressions' float64 reference (a changed parameter fails the trial)
    from attngen.families.decode import DecodeConfig

    o = objective(case, "decode", 1, 77)
    assert o.run(DecodeConfig(16, 4, 1, 2)).status == "ok"
    t = o.sets[0]
    name = "Sinks" if o.spec.sinks else f"XP_{o.spec.params[0].name}"
    t[name].add_(1.0)
    o.hooks.__dict__.pop("_replays", None)
    assert o.run(DecodeConfig(16, 4, 1, 2)).status == "failed"


def test_plan_takes_expression_kernels():
    from attngen.tuning.targets import TuneOptions, plan

    targets = plan(TuneOptions(device="h100", specs=["specs/t5_base.yaml"], families=("fwd", "bwd")))
    assert targets and all(t.spec.has_expr for t in targets)
    targets = plan(TuneOptions(device="h100", specs=["specs/gpt_oss_20b.yaml"], families=("decode",)))
    assert targets and all(t.spec.has_expr and t.spec.family == "decode" for t in targets)
