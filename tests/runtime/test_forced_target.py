"""`dispatch.forced_target`: a scope that picks the kernel family instead of the device (what
`attngen bench`'s attngen-sm80 provider uses on Hopper). On the CPU the interpreter's own family is
sm80, so forcing sm90 shows the switch: the target dispatch reports, the kernel a plan holds, and
plan caches that never hand one target's plan to the other's calls."""

from __future__ import annotations

import pytest
import torch

import attngen
from attngen.runtime import api, dispatch
from attngen.problem import attention_ref, random_inputs
from attngen.testing import assert_flash_rule, check_grads

CPU = torch.device("cpu")


@pytest.fixture
def clean_plans():
    api.clear_plans()
    yield
    api.clear_plans()


def test_scope_sets_and_restores_the_target():
    assert dispatch.device_target(CPU) == "sm80" and dispatch.override() is None
    with dispatch.forced_target("sm90"):
        assert dispatch.device_target(CPU) == "sm90" and dispatch.override() == "sm90"
        assert dispatch.native_target(CPU) == "sm80"
        with dispatch.forced_target("sm80"):  # nests
            assert dispatch.device_target(CPU) == "sm80" and dispatch.override() == "sm80"
        assert dispatch.device_target(CPU) == "sm90"
    assert dispatch.device_target(CPU) == "sm80" and dispatch.override() is None


def test_scope_restores_after_an_exception():
    with pytest.raises(RuntimeError, match="inside"):
        with dispatch.forced_target("sm90"):
            raise RuntimeError("inside")
    assert dispatch.override() is None and dispatch.device_target(CPU) == "sm80"


def test_unknown_target_names_the_argument():
    with pytest.raises(ValueError, match="target: must be one of sm80, sm90, got 'sm75'"):
        with dispatch.forced_target("sm75"):
            pass
    assert dispatch.override() is None


def test_explain_names_the_forced_family(clean_plans):
    q, k, v = (torch.empty(1, 2, 64, 32, dtype=torch.float16) for _ in range(3))
    default = attngen.explain(q, k, v, causal=True)
    with dispatch.forced_target("sm90"):
        forced = attngen.explain(q, k, v, causal=True)
    again = attngen.explain(q, k, v, causal=True)
    assert default["kernel"].endswith("_sm80") and again["kernel"] == default["kernel"]
    assert forced["kernel"].endswith("_sm90") and forced["backward"]["kernel"].endswith("_sm90")
    assert forced["kernel"].replace("_sm90", "_sm80") == default["kernel"]


def test_plan_caches_key_on_the_target(clean_plans):
    """Same tensors and options, one call per target: two plans in every cache (the eager fast
    path's and the backward's too), each holding its own target's kernel, and a warm call finds
    its own again."""
    q, k, v = random_inputs((1, 2, 40, 32), (1, 1, 40, 32), (1, 1, 40, 32), dtype=torch.float16, seed=5)
    dout, = random_inputs(q.shape, dtype=q.dtype, seed=6)

    def run():
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = attngen.attention(*leaves, causal=True)
        return (out.detach(), *torch.autograd.grad(out, leaves, dout))

    default = run()
    with dispatch.forced_target("sm90"):
        forced = run()
    for cache in (api._FWD, api._FAST, api._BWD):
        assert sorted(p.spec.target for p in cache.values()) == ["sm80", "sm90"], cache
    before = {name: dict(c) for name, c in (("fwd", api._FWD), ("fast", api._FAST), ("bwd", api._BWD))}
    again = run()  # warm, default target
    with dispatch.forced_target("sm90"):
        forced_again = run()
    after = {name: dict(c) for name, c in (("fwd", api._FWD), ("fast", api._FAST), ("bwd", api._BWD))}
    assert after == before, "a warm call built a plan instead of finding its own"
    assert all(torch.equal(a, b) for a, b in zip(default + forced, again + forced_again))
    ref, _ = attention_ref(q, k, v, causal=True)
    pt, _ = attention_ref(q, k, v, causal=True, upcast=False)
    for name, (out, *grads) in (("sm80", default), ("forced sm90", forced)):
        assert_flash_rule(name, out, ref, pt, 2.0)
        check_grads(name, lambda *t, upcast: attention_ref(*t, causal=True, upcast=upcast)[0],
                    (q, k, v), dout, grads)
