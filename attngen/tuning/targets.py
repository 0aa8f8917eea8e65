"""What `attngen tune` tunes: its options, the studies they plan (one per kernel, device class and
shape bucket), and each study's search space (the family's config fields, --fix pins, values no
valid config takes dropped)."""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import hashlib
import importlib
import importlib.util
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from attngen import configs as space
from attngen import env
from attngen.buckets import ShapeBucket, bucket_of
from attngen.db import schema
from attngen import devices
from attngen.devices import canonical
from attngen.families import FAMILIES, family as family_of
from attngen.spec import KernelSpec, SpecEntry, SpecError, load_spec, spec_files
from attngen.tuning.sampling import valid_space

DEFAULT_SEQLENS = (1024, 2048, 4096, 8192, 16384)  # Sq = Sk, powers of two
DEFAULT_BATCHES = (1, 4)  # batch x heads classes: the entry's query heads times these
SAMPLERS = ("tpe", "grid")


class TuneError(RuntimeError):
    """A problem found before or while tuning; one line for the user (exit code 2)."""


class NoDevice(TuneError):
    """The machine lacks what tuning needs: no CUDA GPU, or one older than sm80 (exit code 1)."""


# ------------------------------------------------------------------------------------------------
# What to tune

@dataclass(frozen=True)
class Target:
    """One study: a kernel of a spec entry, for one device class and shape bucket."""

    entry: SpecEntry
    spec: KernelSpec
    bucket: ShapeBucket
    kernel_hash: str  # the generated module's KERNEL_HASH (codegen.naming.kernel_hash)
    device_class: str
    fixed: tuple[tuple[str, object], ...] = ()  # --fix FIELD=VALUE: fields pinned to one value

    @property
    def space(self) -> dict[str, tuple]:
        return space_for(self.spec, dict(self.fixed))

    @property
    def study_name(self) -> str:
        """uri.kernel_hash.device_class.bucket.space_hash: a changed kernel or search space
        starts a new study (Optuna cannot change a study's parameter ranges); configs measured in
        the old one are still found and not measured again."""
        sp = json.dumps(self.space, sort_keys=True)
        space_hash = hashlib.sha256(sp.encode()).hexdigest()[:8]
        return f"{self.spec.uri}.{self.kernel_hash}.{self.device_class}.{self.bucket.key}.{space_hash}"

    @property
    def label(self) -> str:
        return f"{self.spec.uri} {self.bucket.key}"


@dataclass
class TuneOptions:
    device: str
    specs: list[str] = field(default_factory=list)  # files or folders; default: env.specs_dir()
    shapes: list[ShapeBucket] | None = None
    trials: int = 20
    timeout: float | None = None
    storage: str | None = None  # default env.tuning_db_url()
    resume: bool = False
    workers: int = 1
    sampler: str = "tpe"
    families: tuple[str, ...] = tuple(FAMILIES)  # every registered family
    kernels: str | None = None  # glob over kernel uris
    fixed: dict = field(default_factory=dict)  # --fix FIELD=VALUE
    seed: int = 0
    worker: tuple[int, int] | None = None  # (index, count) in a --workers child
    gpu: int = 0
    timer_ref: str | None = None  # "file.py:func" / "module:func": a timer instead of do_bench
    probe_ref: str | None = None  # the same for the device probe
    quiet: bool = False
    compile_workers: int | None = None  # None: precompile.default_workers() on a real GPU

    @property
    def url(self) -> str:
        return schema.to_url(self.storage or env.tuning_db_url(writing=True))


DECODE_SEQLENS = (4096, 16384, 65536)  # the decode family's KV lengths (one query token)
DECODE_BATCHES = (1, 8, 32)


def default_buckets(entry: SpecEntry, family: str = "fwd") -> list[ShapeBucket]:
    """Sq = Sk over DEFAULT_SEQLENS, batch x heads = the entry's query heads x DEFAULT_BATCHES; the
    decode family: one query token (the decode bucket, Sq = 1) on DECODE_SEQLENS keys, batch x
    heads = the entry's query heads x DECODE_BATCHES."""
    heads = entry.num_q_heads or 16 * entry.gqa_ratio
    if family == "decode":
        return sorted({bucket_of(1, s, heads * b) for s in DECODE_SEQLENS for b in DECODE_BATCHES})
    return sorted({bucket_of(s, s, heads * b) for s in DEFAULT_SEQLENS for b in DEFAULT_BATCHES})


def plan(opts: TuneOptions) -> list[Target]:
    """The studies to run, in a fixed order (spec files, entries, kernels, buckets)."""
    from attngen.codegen.hashing import stamped_kernel_hash
    from attngen.codegen.render import render  # jinja2: the tuner may import it

    profile = devices.profile(canonical(opts.device))
    try:
        files = [f for t in (opts.specs or [env.specs_dir()]) for f in spec_files(t)]
        loaded = [load_spec(f) for f in files]
    except SpecError as exc:
        raise TuneError(str(exc).splitlines()[0] + (" (and more)" if len(exc.problems) > 1 else "")) from None
    targets, seen, mismatched = [], set(), []
    for sf in loaded:
        for entry in sf.entries:
            for spec in entry.kernel_specs():
                if spec.target != profile.target or spec.family not in opts.families:
                    continue
                if opts.kernels and not fnmatch.fnmatchcase(spec.uri, opts.kernels):
                    continue
                if spec.uri in seen:  # two entries with one kernel: the first one's values
                    continue
                seen.add(spec.uri)
                h = stamped_kernel_hash(render(spec))
                try:
                    fixed = tuple(sorted(pin(spec, opts.fixed).items()))
                except ValueError as exc:
                    raise TuneError(f"--fix: {exc}") from None
                for b in (opts.shapes or default_buckets(entry, spec.family)):
                    if b.decode != (spec.family == "decode"):  # --shapes tune the families of their kind
                        mismatched.append((b.key, spec.family))
                        continue
                    targets.append(Target(entry, spec, b, h, profile.name, fixed))
    used = {name for t in targets for name, _ in t.fixed}
    for name in opts.fixed:
        if targets and name not in used:
            names = sorted({f.name for t in targets for f in dataclasses.fields(family_of(t.spec.family).config)})
            raise TuneError(f"--fix: no kernel to tune has a config field {name!r} (fields: "
                            f"{', '.join(names)})")
    if not targets and mismatched:
        key, fam = mismatched[0]
        raise TuneError(f"{key}: " + ("the decode family tunes on decode buckets only (q1_k<S>_bh<B*H>)"
                                      if fam == "decode" else "the decode bucket (Sq = 1) is tuned by the "
                                      "decode family only, not by the fwd / bwd kernels selected"))
    if not targets:
        raise TuneError(f"nothing to tune: no {'/'.join(opts.families)} kernel for target "
                        f"{profile.target} in {', '.join(map(str, files))}"
                        + (f" matches --kernels {opts.kernels!r}" if opts.kernels else ""))
    return targets


def load_ref(ref: str) -> Callable:
    """"path/to/file.py:func" or "package.module:func" -> the function."""
    mod_name, sep, func = ref.rpartition(":")
    if not sep or not mod_name or not func:
        raise TuneError(f"{ref!r}: expected FILE.py:FUNCTION or MODULE:FUNCTION")
    try:
        if mod_name.endswith(".py"):
            path = Path(mod_name).resolve()
            spec = importlib.util.spec_from_file_location(f"attngen_ref_{path.stem}", path)
            if spec is None or not path.exists():
                raise TuneError(f"{ref!r}: no such file {path}")
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
        else:
            mod = importlib.import_module(mod_name)
        return getattr(mod, func)
    except (ImportError, AttributeError, OSError) as exc:
        raise TuneError(f"{ref!r}: cannot load it ({type(exc).__name__}: {exc})") from None


def pin(spec: KernelSpec, fixed: dict[str, str | object]) -> dict[str, object]:
    """The --fix FIELD=VALUE pairs this kernel's config class has, values parsed to the field's
    type (plan() makes sure every pinned field exists in some planned kernel)."""
    fields = {f.name: f for f in dataclasses.fields(family_of(spec.family).config)}
    return {name: _parse_value(name, value, fields[name].type)
            for name, value in fixed.items() if name in fields}


def _parse_value(name: str, value, type_) -> object:
    if not isinstance(value, str):
        return value
    t = str(type_)
    if "bool" in t:
        if value.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"{name}={value!r}: expected true or false")
        return value.lower() in ("true", "1")
    try:
        return int(value) if "int" in t else float(value) if "float" in t else value
    except ValueError:
        raise ValueError(f"{name}={value!r}: expected {t}") from None


def space_for(spec: KernelSpec, fixed: dict | None = None) -> dict[str, tuple]:
    """The search space of a kernel: its family's config fields -> candidates (attngen/configs.py), with
    the --fix fields pinned, and without the candidate values no valid config of this kernel
    takes (e.g. the Gluon kernels' knobs at a head dim they do not exist for), so the sampler
    never proposes them."""
    sp = space.search_space(family_of(spec.family).config, spec.family, spec.target)
    for name, value in (fixed or {}).items():
        sp[name] = (value,)
    return dict(_drop_never_valid(spec, tuple(sp.items())))


@functools.lru_cache(maxsize=256)
def _drop_never_valid(spec: KernelSpec, items: tuple) -> tuple:
    """For each candidate value not yet seen in a valid config, the configs that hold it, until one
    is valid (every value of that config counts as seen): a value some valid config takes costs a
    few checks, and only a value none takes costs its whole slice of the space (a scan of the whole
    product in order would cost that much for any one such value)."""
    fam = family_of(spec.family)
    names = [name for name, _ in items]
    used: dict[str, set] = {name: set() for name in names}
    for i, (name, cands) in enumerate(items):
        others = [c for j, (_, c) in enumerate(items) if j != i]
        for value in cands:
            if value in used[name]:
                continue
            for rest in itertools.product(*others):
                values = (*rest[:i], value, *rest[i:])
                if fam.check(spec, fam.config(**dict(zip(names, values)))) is None:
                    for n, v in zip(names, values):
                        used[n].add(v)
                    break
        if not used[names[0]]:  # the first field's slices are the whole space, and nothing in it is
            return items        # valid: the space as it is (the study reports it)
    return tuple((name, tuple(c for c in cands if c in used[name])) for name, cands in items)


def valid_count(spec: KernelSpec, space_: dict[str, tuple] | None = None) -> int:
    """Configs of the space (the kernel's full space by default) that pass the validity filter."""
    return len(valid_space(spec, space_ or space_for(spec)))


def in_space(config: dict, space_: dict[str, tuple]) -> bool:
    return set(config) == set(space_) and all(config[k] in space_[k] for k in config)


def default_config(spec: KernelSpec, kind: str, seqlen_q: int):
    return family_of(spec.family).default(spec, kind, seqlen_q)

