"""Is the search worth it? Optuna against the exhaustive grid over the same space (`attngen db
compare`): replays of a sampler against a table of measured times, and the comparison of two
tuning databases."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import statistics
import warnings

from attngen.db import schema
from attngen.db import store as dbs
from attngen.spec import KernelSpec
from attngen.tuning.sampling import make_sampler, valid_space
from attngen.tuning.study import TrialFailed, make_storage
from attngen.tuning.targets import TuneError, default_config, in_space, space_for, valid_count

def replay(table: dict[str, float | None], space_: dict[str, tuple], budget: int, seed: int,
           sampler: str = "tpe", first: dict | None = None,
           spec: KernelSpec | None = None) -> tuple[float, int]:
    """Run a sampler against a table of measured times (config_json -> ms, None = failed; a config
    not in the table counts as invalid) until `budget` distinct table configs were seen; returns
    (best ms found, distinct configs seen). `first` is enqueued first (the default config). With
    `spec`, the sampler proposes as in `attngen tune` (the ValidSpace walk of sampling.py);
    without, every field independently over the flat space."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    study = optuna.create_study(sampler=make_sampler(sampler, space_, budget, seed), direction="minimize")
    walk = valid_space(spec, space_) if spec is not None else None
    if first is not None:
        params = first if walk is None else walk.params(first)
        if params is not None:
            study.enqueue_trial(params)
    seen: dict[str, float | None] = {}
    rng = random.Random(seed)

    def objective(trial):
        if walk is None:
            values = {n: trial.suggest_categorical(n, list(c)) for n, c in space_.items()}
        else:
            values = walk.suggest(trial)
        key = schema.config_json(values)
        if key not in table:
            raise TrialFailed("invalid")
        if key in seen and walk is not None:
            walk.after_repeat(trial.study, values, set(seen), rng)
        seen[key] = table[key]
        if table[key] is None:
            raise TrialFailed("failed")
        return table[key]

    def stop(study_, t):
        if len(seen) >= budget or t.number + 1 >= 20 * budget + 100:
            study_.stop()

    study.optimize(objective, callbacks=[stop], catch=(TrialFailed,), n_trials=20 * budget + 100)
    ok = [v for v in seen.values() if v is not None]
    return (min(ok) if ok else math.inf), len(seen)


def _study_space(url: str, study_name: str | None) -> dict[str, tuple] | None:
    """The parameter space an Optuna study sampled from (its trials' distributions)."""
    import optuna

    if not study_name:
        return None
    try:
        study = optuna.load_study(study_name=study_name, storage=make_storage(schema.to_url(url)))
    except (KeyError, TuneError):
        return None
    for t in study.get_trials(deepcopy=False):
        if t.distributions:
            return {n: tuple(d.choices) for n, d in t.distributions.items()}
    return None


def compare(exhaustive: str, search: str, budget_frac: float = 0.30, goal_gap: float = 0.03,
            seeds: int = 20) -> dict:
    """For each (kernel, device class, bucket) tuned in both databases: the exhaustive best, the
    searched winner's time (live, and as the exhaustive run measured that config), the fraction of
    the measured configs the search needed; plus replays of TPE, and of random search for scale,
    against the exhaustive table over `seeds` seeds with the same budget. The space is the one the
    exhaustive study sampled (its Optuna distributions, --fix included)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    with dbs.Store(exhaustive, "read") as a, a.session() as s:
        ex_trials = dbs.where_trials(s)
    with dbs.Store(search, "read") as b, b.session() as s:
        se_trials = dbs.where_trials(s)
        se_winners = dbs.where_winners(s)

    def key_of(t) -> tuple:
        return (t["uri"], t["template_hash"], t["device_class"], t["bucket"])

    rows = []
    for w in se_winners:
        key = (w.uri, w.template_hash, w.device_class, w.bucket)
        mine = [t for t in ex_trials if key_of(t) == key and t["status"] != "invalid"]
        if not mine:
            continue
        studies: dict[str | None, int] = {}
        for t in mine:
            studies[t["study_name"]] = studies.get(t["study_name"], 0) + 1
        ex_study = max(studies, key=lambda n: (studies[n], n or ""))
        tab: dict[str, float | None] = {}
        for t in mine:
            if t["study_name"] != ex_study:
                continue
            ck = schema.config_json(t["config"])
            if t["status"] == "ok":
                tab[ck] = min(t["time_ms"], tab.get(ck) or math.inf)
            else:
                tab.setdefault(ck, None)
        spec = KernelSpec(**mine[0]["spec"])
        space_ = _study_space(exhaustive, ex_study) or space_for(spec)

        # the default config is measured under the study's name even when it lies outside the
        # study's space (e.g. pinned away by --fix): not part of the exhaustive grid
        tab = {k: v for k, v in tab.items() if in_space(json.loads(k), space_)}
        ok = [v for v in tab.values() if v is not None]
        if not ok:
            continue
        best = min(ok)
        # the search's pick within the space (its database winner may be the default measured
        # outside it, as in the exhaustive study), and the space's configs it measured
        se_mine = [t for t in se_trials if key_of(t) == key and t["status"] != "invalid"
                   and in_space(t["config"], space_)]
        se_measured = len({schema.config_json(t["config"]) for t in se_mine})
        se_studies = sorted({t["study_name"] or "" for t in se_mine})
        se_ok = [t for t in se_mine if t["status"] == "ok"]
        se_best = min(se_ok, key=lambda t: t["time_ms"]) if se_ok else None
        picked = tab.get(schema.config_json(se_best["config"])) if se_best else None
        budget = max(1, int(budget_frac * len(tab)))
        valid = valid_count(spec, space_)
        dflt = dataclasses.asdict(default_config(spec, "cuda", schema.bucket_fields(w.bucket)[0]))
        dflt = dflt if schema.config_json(dflt) in tab else None
        rep = {}
        for name, smp, first in (("tpe_with_default", "tpe", dflt), ("tpe_from_scratch", "tpe", None),
                                 ("random_from_scratch", "random", None)):
            gaps = [replay(tab, space_, budget, sd, smp, first, spec)[0] / best - 1
                    for sd in range(seeds)]
            rep[name] = {"median_gap": statistics.median(gaps), "worst_gap": max(gaps),
                         "share_within_goal": sum(g <= goal_gap for g in gaps) / len(gaps)}
        gap = picked / best - 1 if picked else None
        frac = se_measured / len(tab)
        rows.append({
            "uri": w.uri, "bucket": w.bucket, "device_class": w.device_class,
            "exhaustive_study": ex_study, "search_studies": se_studies,
            "same_space": se_studies == [ex_study or ""],
            "space": {k: list(v) for k, v in space_.items()},
            "space_valid": valid, "exhaustive_complete": len(tab) >= valid,
            "exhaustive_measured": len(tab), "exhaustive_best_ms": best,
            "search_measured": se_measured, "search_fraction": frac,
            "search_winner": se_best["config"] if se_best else None,
            "search_winner_ms_live": se_best["time_ms"] if se_best else None,
            "search_winner_ms_in_exhaustive_run": picked,
            "database_winner": w.config, "database_winner_in_space": in_space(w.config, space_),
            "gap": gap, "gap_live": se_best["time_ms"] / best - 1 if se_best else None,
            "meets_goal": (gap is not None and gap <= goal_gap and frac <= budget_frac + 1e-9
                           and len(tab) >= valid),
            "replay_budget": budget, "replay_seeds": seeds, "replay": rep,
        })
    return {"goal": {"gap": goal_gap, "fraction": budget_frac},
            "exhaustive": schema.redact(schema.to_url(exhaustive)),
            "search": schema.redact(schema.to_url(search)), "rows": rows,
            "all_meet_goal": bool(rows) and all(r["meets_goal"] for r in rows)}
