"""What every kernel family shares: the Family record (attngen.families registers one per family
module), the shared-memory limits, the launchers' choke point (require_valid) and the generic
search-space helpers. Pure Python: no torch, triton or jinja2."""

from __future__ import annotations

import dataclasses
import importlib
import itertools
from dataclasses import dataclass, field
from typing import Callable

from attngen.spec import KernelSpec


@dataclass(frozen=True)
class Family:
    """One kernel family, declared by its module (attngen/families/<name>.py): the template it
    renders, its launch-config dataclass, validity filter, default table and search space, the JIT
    entry points its modules define, and the hooks the runtime plan, the tuner and the benchmark
    call (each "module:function", imported on first use so that planning pays only for its own)."""

    name: str
    template: str  # templates/<template>
    config: type  # the frozen launch-config dataclass
    check: Callable  # (KernelSpec, config) -> None | the reason it cannot launch
    # (KernelSpec, device_kind, seqlen_q class, window: keys a query sees under a sliding window,
    # or None) -> config
    default: Callable
    # every JIT entry point a launcher may launch; the first is the portable one every generated
    # module of the family defines (the others exist where the target and head dim have them)
    kernels: tuple[str, ...]
    launcher: str  # "module:function": a call's tensors, mask values and config -> its Launches
    flop_factor: float  # the work of one call in forward FLOPs (the backward counts 2.5 of them)
    outputs: tuple[str, ...]  # the tensors a call writes, checked by the tuner before a config wins
    space: dict = field(default_factory=dict)  # field -> candidate values, every target
    target_spaces: dict = field(default_factory=dict)  # target -> {field: candidates}, added / overriding
    # (config, spec) -> the config the portable (pointer) kernels run for `config`: a plan's
    # downgrade (host-bound shapes, tensors the copy engine cannot address)
    portable: Callable | None = None
    # (KernelSpec) -> {variant: bool}: the optional kernels a spec's module gets (codegen reads it)
    variants: Callable | None = None
    # "module:name" of the family's tuning hooks (attngen.tuning.objective.FamilyHooks): inputs,
    # launch, reference, accuracy check
    hooks: str = ""
    # (KernelSpec) -> {name: value}: what the family's template reads beyond the common context
    context: Callable | None = None
    # (config, spec) -> the config whose kernels make no TMA descriptor in the kernel, for a call
    # run with ATTNGEN_KERNEL_DESCRIPTORS=0 (env.kernel_descriptors); None: the family makes none
    host_descriptors: Callable | None = None

    def launches(self) -> Callable:
        return _resolve(self.launcher)

    def tuning_hooks(self):
        return _resolve(self.hooks)()


def _resolve(ref: str):
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


# Shared memory per block, bytes (the opt-in limit).
SMEM_LIMIT = {"sm80": 163 * 1024, "sm90": 227 * 1024}

# the Gluon kernels' launch register cap: 12 warps (3 warp groups) fit an SM
WS_MAXNREG = 168


class InvalidConfig(ValueError):
    """A config that the validity filter rejects reached a launch."""


def require_valid(spec: KernelSpec, cfg, check) -> None:
    """The launchers' choke point: every config that reaches a launch passes the validity filter
    the tuner uses (`check`: check_fwd / check_bwd), whatever path (tuned winner, default table,
    forced config, a plan's downgrade or a launcher's fallback) produced it."""
    why = check(spec, cfg)
    if why is not None:
        raise InvalidConfig(f"{spec.uri}: config {cfg} is rejected by the validity filter ({why}); "
                            "it cannot be launched")



# Search spaces: each family module declares candidate values per config field (Family.space and,
# per kernel target, Family.target_spaces). A field listed there is searched over its candidates, a
# field not listed keeps its dataclass default (so a new field with a default plugs in untuned
# until its candidates are added). The order in which TPE's walk (tuning/sampling.py) picks fields:
# the knobs that choose a kernel first (the target's space, in its order, then these), since they
# fix or rule out values of the others; the remaining fields in config order.
KERNEL_KNOBS = ("atomic_dq", "warp_specialize", "persistent", "lazy_rescale")


def search_order(fam: Family, target: str, names: list[str]) -> list[str]:
    """`names` (a space's fields) in the order TPE's walk picks them."""
    first = [n for n in (*fam.target_spaces.get(target, {}), *KERNEL_KNOBS) if n in names]
    return first + [n for n in names if n not in first]


def search_space(fam: Family, target: str) -> dict[str, tuple]:
    """Every field of the family's config class -> its candidate values, in field order."""
    cands = {**fam.space, **fam.target_spaces.get(target, {})}
    out = {}
    for f in dataclasses.fields(fam.config):
        if f.name in cands:
            out[f.name] = tuple(cands[f.name])
        elif f.default is not dataclasses.MISSING:
            out[f.name] = (f.default,)
        else:
            raise ValueError(f"{fam.config.__name__}.{f.name}: no candidate values in the {fam.name} "
                             f"search space and no default (add it to attngen/families/{fam.name}.py's SPACE)")
    unknown = set(cands) - set(out)
    if unknown:
        raise ValueError(f"{fam.name} search space names fields {fam.config.__name__} does not have: "
                         f"{', '.join(sorted(unknown))}")
    return out


def config_from_dict(config_cls: type, values: dict):
    """A config object from a field -> value dict; fields left out take their defaults. A
    ValueError names unknown or missing fields (a stored config of another config layout)."""
    names = {f.name for f in dataclasses.fields(config_cls)}
    unknown = set(values) - names
    if unknown:
        raise ValueError(f"{config_cls.__name__} has no field(s) {', '.join(sorted(unknown))}")
    try:
        return config_cls(**values)
    except TypeError as exc:
        raise ValueError(f"{config_cls.__name__}: {exc}") from None



def enumerate_space(fam: Family, spec: KernelSpec) -> list[tuple[object, str | None]]:
    """Every config of the search space with fam.check(spec, cfg) (None = valid), in grid order."""
    space = search_space(fam, spec.target)
    out = []
    for values in itertools.product(*space.values()):
        cfg = fam.config(**dict(zip(space, values)))
        out.append((cfg, fam.check(spec, cfg)))
    return out


def replay(hooks, obj, cfg, t: dict) -> None:
    """Run config `cfg` on input set `t` for a tuning objective: hooks.steps(obj, cfg, t) (kernel
    launches, and zero-argument callables for work between them) made once per (config, input
    set), each launch compiled once (CompiledLaunch), then replayed on every later call, as the
    runtime replays a plan: going through the launchers and Triton's JIT on each timed step made
    short buckets time Python. Kept on `hooks`, one config's input sets at a time; `t` is held with
    them so that its id, the key, is not reused while cached."""
    from attngen.kernels.launch import CompiledLaunch, Launch

    replays = hooks.__dict__.setdefault("_replays", {})
    key = (id(t), cfg)
    if key not in replays:
        if replays and next(iter(replays))[1] != cfg:
            replays.clear()
        steps = [(CompiledLaunch(x, obj.device, obj.kind == "cpu"), x.values) if isinstance(x, Launch)
                 else ((lambda values, ok, f=x: f()), None) for x in hooks.steps(obj, cfg, t)]
        replays[key] = (t, steps)
    for fn, values in replays[key][1]:
        fn(values, True)
