"""TPE's view of a space (tuning/sampling.py): every proposal is a valid config, enqueued configs
come back as themselves, a repeated proposal is followed by the nearest unmeasured config; and
the head start on compiling (tuning/precompile.py) in worker processes."""

from __future__ import annotations

import dataclasses
import json
import random

import optuna
import pytest

from attngen.db.schema import config_json
from attngen.families import family as family_of
from attngen.spec import load_spec
from attngen.tuning import objective as obj
from attngen import configs as space
from attngen.tuning import targets
from attngen.tuning.compare import replay
from attngen.buckets import parse_bucket
from attngen.tuning.precompile import precompile
from attngen.tuning.sampling import make_sampler, valid_space
from attngen.env import REPO_ROOT


def kernel(file="llama.yaml", name="llama3_8b", family="fwd", target="sm90", dtype="bf16"):
    sf = load_spec(REPO_ROOT / "specs" / file)
    e = next(x for x in sf.entries if x.name == name)
    s = next(k for k in e.kernel_specs() if (k.family, k.dtype, k.target) == (family, dtype, target))
    return e, s


@pytest.mark.parametrize("family", ["fwd", "bwd"])
def test_every_proposal_is_valid_and_the_walk_covers_the_valid_configs(family):
    _, spec = kernel(family=family)
    sp = targets.space_for(spec)
    walk = valid_space(spec, sp)
    fam = family_of(family)
    assert len(walk) == targets.valid_count(spec, sp) > 0
    assert len({config_json(c) for c in walk.configs()}) == len(walk)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    seen = set()
    for _ in range(200):
        trial = study.ask()
        cfg = walk.suggest(trial)
        assert list(cfg) == list(sp)  # the config's own field order
        assert fam.check(spec, fam.config(**cfg)) is None, cfg
        study.tell(trial, 1.0)
        seen.add(config_json(cfg))
    assert len(seen) > 20  # random proposals spread over the valid configs
    # the kernel-choosing knob is asked first, and a field with one possible value is no parameter
    if family == "fwd":
        assert walk.names[0] == "consumers"
        gluon = next(c for c in walk.configs() if c["consumers"] == 2)
        params = walk.params(gluon)
        assert "block_m" not in params and "num_warps" not in params  # fixed by consumers = 2
        assert any(p.startswith("block_n[") for p in params)  # a subset of block_n's candidates


def test_params_round_trip_and_reject_what_is_not_a_valid_config():
    _, spec = kernel()
    sp = targets.space_for(spec)
    walk = valid_space(spec, sp)
    for cfg in random.Random(0).sample(walk.configs(), 40):
        study = optuna.create_study()
        study.enqueue_trial(walk.params(cfg))
        assert walk.suggest(study.ask()) == cfg
    bad = dict(walk.configs()[0], num_stages=99)
    assert walk.params(bad) is None
    invalid = dict(walk.configs()[0], consumers=2, block_m=64)  # the Gluon kernel needs 128
    assert family_of("fwd").check(spec, family_of("fwd").config(**invalid)) is not None
    assert walk.params(invalid) is None


def test_nearest_unseen_is_the_closest_config_not_measured():
    _, spec = kernel()
    walk = valid_space(spec, targets.space_for(spec))
    cfgs = walk.configs()
    start = next(c for c in cfgs if c["consumers"] == 2)
    seen = {config_json(start)}
    nxt = walk.nearest_unseen(start, seen, random.Random(0))
    d = sum(nxt[k] != start[k] for k in start)
    assert config_json(nxt) not in seen and d == 1
    assert min(sum(c[k] != start[k] for k in start) for c in cfgs if config_json(c) not in seen) == d
    assert walk.nearest_unseen(start, {config_json(c) for c in cfgs}, random.Random(0)) is None


def test_replay_with_the_walk_measures_only_valid_configs_and_finds_a_clear_best():
    _, spec = kernel()
    sp = targets.space_for(spec)
    walk = valid_space(spec, sp)
    rng = random.Random(1)
    table = {}
    for c in walk.configs():  # the Gluon kernels 20 % ahead, one of them best by 5 %
        table[config_json(c)] = (1.0 if c["consumers"] else 1.2) + 0.05 + 0.05 * rng.random()
    best_key = min((k for k in table if json.loads(k)["consumers"] == 2), key=table.get)
    table[best_key] = 1.0
    budget = int(0.3 * len(table))
    for seed in range(3):
        best, seen = replay(table, sp, budget, seed, "tpe", spec=spec)
        assert seen == budget and best == 1.0
    # without the walk the same budget of flat proposals is mostly invalid ones
    flat = optuna.create_study(sampler=make_sampler("random", sp, budget, 0))
    proposals = [{n: t.suggest_categorical(n, list(c)) for n, c in sp.items()}
                 for t in (flat.ask() for _ in range(100))]
    assert sum(config_json(p) in table for p in proposals) < 40


def test_precompile_launches_every_config_in_worker_processes():
    e, spec = kernel(dtype="fp16")
    problem = obj.problem_for(e, spec, parse_bucket("q32_k32_bh4"))
    cfgs = [dataclasses.asdict(space.FwdConfig(16, 16, 4, 1)), dataclasses.asdict(space.FwdConfig(32, 16, 4, 1)),
            dataclasses.asdict(space.FwdConfig(48, 16, 4, 1))]  # no power of two: fails
    counts = precompile(spec, problem, cfgs, "cpu", 2)
    assert counts["configs"] == 3 and counts["stopped"] is None
    assert (counts["compiled"], counts["failed"]) == (2, 1)
    assert precompile(spec, problem, [], "cpu", 2)["compiled"] == 0
