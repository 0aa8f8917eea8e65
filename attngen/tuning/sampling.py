"""How a study's sampler sees a search space.

The flat space (space.search_space: every config field -> its candidates) is mostly invalid: at
head dim 128 on sm90, 292 of its 2,304 forward combinations pass the validity filter, because
the knobs that choose a kernel (the Gluon kernels' `consumers`, `tma`, ...) fix or rule out
most of the others. A sampler proposing fields independently spends most of its proposals on
configs the filter rejects, and TPE learns nothing from them (failed trials do not enter its
model).

ValidSpace walks the fields in search order (the kernel-choosing knobs first, space.search_order)
and offers each field only the values some valid config takes given the fields chosen before, so
every proposal is a valid config. A field left with one value is not a parameter at all. Optuna
needs one fixed set of choices per parameter name, so a field offered a subset of its candidates
is a parameter of its own, named after the subset: `block_n` (every candidate), `block_n[64/128]`
(the Gluon kernel's choices), and TPE (multivariate, grouped) models each such group apart.

TPE on a few hundred configs keeps proposing its favourite once it has one; a proposal measured
before gets its known time back and the next trial is the unmeasured config nearest to it
(after_repeat), so the budget goes to new configs around the best region.

The exhaustive grid does not walk: the tuner enqueues every valid config of the flat space, in a
seeded order, as trials of their own.
"""

from __future__ import annotations

import functools
import itertools

from attngen.families import family as family_of
from attngen.spec import KernelSpec
from attngen import configs as space


class ValidSpace:
    """The valid configs of a (spec, space) and the field-by-field walk through them."""

    def __init__(self, spec: KernelSpec, space_: dict[str, tuple]):
        fam = family_of(spec.family)
        self.space = dict(space_)
        self.names = space.search_order(spec.family, spec.target, list(space_))
        self.rows: list[tuple] = []  # valid configs, values in self.names order
        for values in itertools.product(*(space_[n] for n in self.names)):
            if fam.check(spec, fam.config(**dict(zip(self.names, values)))) is None:
                self.rows.append(values)

    def __len__(self) -> int:
        return len(self.rows)

    def configs(self) -> list[dict]:
        """The valid configs (field -> value, the space's field order)."""
        out = []
        for r in self.rows:
            values = dict(zip(self.names, r))
            out.append({n: values[n] for n in self.space})
        return out

    def param_name(self, name: str, allowed: tuple) -> str:
        if allowed == self.space[name]:
            return name
        return f"{name}[{'/'.join(str(v) for v in allowed)}]"

    def _walk(self, choose) -> dict:
        """choose(field, param name, allowed values) -> value, for each field with a choice."""
        rows = self.rows
        out = {}
        for i, name in enumerate(self.names):
            allowed = tuple(v for v in self.space[name] if any(r[i] == v for r in rows))
            value = allowed[0] if len(allowed) == 1 else choose(name, self.param_name(name, allowed), allowed)
            out[name] = value
            rows = [r for r in rows if r[i] == value]
        return {n: out[n] for n in self.space}  # the config's field order

    def suggest(self, trial) -> dict:
        """A valid config (field -> value) from an Optuna trial."""
        if not self.rows:
            raise ValueError("no valid config in this space")
        return self._walk(lambda _name, param, allowed: trial.suggest_categorical(param, list(allowed)))

    def params(self, config: dict) -> dict | None:
        """The trial parameters that make suggest() return `config` (for study.enqueue_trial);
        None when `config` is not a valid config of this space."""
        picked = {}

        def choose(name, param, allowed):
            if config.get(name) not in allowed:
                raise KeyError(name)
            picked[param] = config[name]
            return config[name]

        try:
            walked = self._walk(choose)
        except KeyError:
            return None
        return picked if walked == {n: config.get(n) for n in self.space} else None


    def nearest_unseen(self, config: dict, seen: set[str], rng) -> dict | None:
        """The valid config that is not in `seen` (config_json keys) and differs from `config` in
        the fewest fields (ties: rng's choice); None when every valid config was seen."""
        from attngen.db.schema import config_json

        best, best_d = [], None
        for r in self.rows:
            cand = dict(zip(self.names, r))
            d = sum(cand[n] != config.get(n) for n in self.names)
            if best_d is not None and d > best_d:
                continue
            cand = {n: cand[n] for n in self.space}
            if config_json(cand) in seen:
                continue
            if best_d is None or d < best_d:
                best, best_d = [], d
            best.append(cand)
        return rng.choice(best) if best else None

    def after_repeat(self, study, config: dict, seen: set[str], rng) -> None:
        """TPE proposed `config`, measured before: its known time goes back to TPE, and the next
        trial is the nearest config not measured yet (enqueued), so that exploiting TPE's
        favourite region explores around it instead of proposing the same config again."""
        nxt = self.nearest_unseen(config, seen, rng)
        if nxt is not None:
            study.enqueue_trial(self.params(nxt))


@functools.lru_cache(maxsize=64)
def _valid_space(spec: KernelSpec, items: tuple) -> ValidSpace:
    return ValidSpace(spec, dict(items))


def valid_space(spec: KernelSpec, space_: dict[str, tuple]) -> ValidSpace:
    return _valid_space(spec, tuple(space_.items()))


def make_sampler(kind: str, space_: dict[str, tuple], budget: int, seed: int):
    """grid: the sampler behind the enqueued valid configs (study.Study); tpe: TPE over the ValidSpace walk's parameters
    (multivariate and grouped: a kernel's knobs are modelled together, apart from another
    kernel's), its first max(3, min(10, budget // 4)) trials random; random: for scale."""
    import optuna

    if kind in ("grid", "random"):  # grid: the tuner enqueues every valid config, in a seeded order
        return optuna.samplers.RandomSampler(seed=seed)
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=max(3, min(10, budget // 4)),
                                      multivariate=True, group=True, constant_liar=True)
