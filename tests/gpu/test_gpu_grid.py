"""The GPU correctness grid: every kernel path the dispatcher can choose, forced on every head-dim
class, on flash-attn-style odd shapes, against a float64 reference.

Two parts:
* DEFAULT: every head dim 8, 16, ..., 256 plus odd ones, through attngen.attention /
  attention_varlen as a user calls them (tuned or default config, the plan's downgrades for
  host-bound shapes included), seqlen pairs, dtypes, masks, GQA ratios and layouts drawn from one
  seeded generator.
* FORCED: one representative head dim per class (one power-of-two tile, one padded tile, two
  column tiles full or with masked columns, the Gluon head dims) x every path of PATHS, run under
  dispatch.forced_config, each checked to have launched the kernels its path names.
* SWEEPS: a path a default newly takes, over every mask, layout and head layout it accepts.
Each case checks the output (flash-attn rule: error <= 2x PyTorch's in the same precision), the
LSE and the gradients (3x), on fresh random inputs with the output memory poisoned first. With
ATTNGEN_GRID_RESULTS=path.json the run writes one record per case (tests/gpu/conftest.py); its
max_err_ratio is the largest error / allowed bound (factor x PyTorch's error + ATOL) over out, dq,
dk and dv: at most 1 on a passing case.

`pytest -m gpu tests/gpu/test_gpu_grid.py -n 12` runs the seeded sample in a few minutes on the
H200; `-m gpu_full` adds FULL, the whole product of head dims and paths.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import random
from dataclasses import dataclass

import pytest
import torch

import attngen
from attngen.families.decode import MAX_QUERY
from attngen.runtime import api, dispatch, kvcache
from attngen.spec import KernelSpec
from attngen.problem import Problem
from attngen.testing import assert_flash_rule, assert_lse_close, max_err
from attngen import configs as space
from attngen.configs import BwdConfig, FwdConfig

pytestmark = pytest.mark.gpu

RESULTS_ENV = "ATTNGEN_GRID_RESULTS"
SEED = 2027
ATOL = 1e-4  # the flash-attn rule's absolute slack: max|x - x64| <= factor * max|x_torch - x64| + ATOL
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
HEAD_DIMS = list(range(8, 257, 8)) + [59, 111, 203]
SEQLENS = [(113, 203), (128, 217), (113, 211), (108, 256), (256, 512), (512, 256), (1024, 1024),
           (1023, 1024), (1024, 1023), (2048, 2048), (1, 239), (3, 799), (239, 1), (799, 3),
           (64, 128), (200, 203)]
# one head dim per class: power-of-two tile (64, 128, 256: the Gluon head dims too), padded tile
# (8, 59, 111, 203), two column tiles full (48, 80, 96, 192) or with masked columns (40, 72, 88)
CLASSES = {8: "one padded tile", 40: "two tiles, masked columns", 48: "two tiles", 59: "one padded tile",
           64: "power of two (Gluon)", 72: "two tiles, masked columns", 80: "two tiles",
           88: "two tiles, masked columns", 96: "two tiles", 111: "one padded tile",
           128: "power of two (Gluon)", 160: "two tiles", 192: "two tiles (Gluon)",
           203: "one padded tile", 256: "power of two (Gluon)"}
HEADS = {"mha": (6, 6), "gqa": (6, 2), "mqa": (6, 1)}


@dataclass(frozen=True)
class Path:
    """A kernel path: candidate configs (the first that the validity filter takes for the call's
    kernel is forced) and the kernels it must launch."""

    name: str
    family: str
    configs: tuple
    kernels: tuple[str, ...]
    packed: bool | None = None  # only packed documents (True) / only dense calls (False)
    # the kernel family the path runs: "sm80" forces it on the H200 (dispatch.forced_target), as
    # `attngen bench`'s attngen-sm80 provider does; a path with no configs runs that target's own
    # tuned or default configs
    target: str = "sm90"


FWD_PATHS = [
    Path("fwd:pointer", "fwd", (FwdConfig(64, 64, 4, 2),), ("_attn_fwd",)),
    Path("fwd:pointer-128x64-lazy", "fwd", (FwdConfig(128, 64, 8, 1, lazy_rescale=True),
                                           FwdConfig(64, 32, 4, 1, lazy_rescale=True)), ("_attn_fwd",)),
    Path("fwd:tma", "fwd", (FwdConfig(64, 64, 4, 3, tma=True), FwdConfig(64, 64, 4, 2, tma=True),
                            FwdConfig(64, 32, 4, 2, tma=True)), ("_attn_fwd_tma",)),
    Path("fwd:tma-q_regs", "fwd", (FwdConfig(64, 64, 4, 3, tma=True, q_regs=True),
                                   FwdConfig(64, 64, 4, 2, tma=True, q_regs=True),
                                   FwdConfig(64, 32, 4, 2, tma=True, q_regs=True)), ("_attn_fwd_tma",)),
    Path("fwd:tma-128-lazy", "fwd", (FwdConfig(128, 64, 8, 2, tma=True, lazy_rescale=True),
                                     FwdConfig(128, 32, 8, 1, tma=True, lazy_rescale=True)), ("_attn_fwd_tma",)),
    Path("fwd:tma-persistent", "fwd", (FwdConfig(64, 64, 4, 2, tma=True, persistent=2),
                                       FwdConfig(64, 32, 4, 2, tma=True, persistent=2)), ("_attn_fwd_tma",)),
    Path("fwd:tma-warp_specialize", "fwd", (FwdConfig(128, 64, 8, 2, tma=True, warp_specialize=True),
                                            FwdConfig(128, 32, 8, 2, tma=True, warp_specialize=True)),
         ("_attn_fwd_tma",)),
    Path("fwd:gluon-1", "fwd", (FwdConfig(64, 128, 4, 2, tma=True, consumers=1),
                                FwdConfig(64, 64, 4, 2, tma=True, consumers=1)), ("_attn_fwd_ws",), False),
    Path("fwd:gluon-2", "fwd", (space.WS_DEFAULT, space.WS_DEFAULT_WIDE), ("_attn_fwd_ws",)),
    Path("fwd:gluon-2-pair", "fwd", (dataclasses.replace(space.WS_DEFAULT, pair_tiles=True),
                                     dataclasses.replace(space.WS_DEFAULT_WIDE, pair_tiles=True)),
         ("_attn_fwd_ws",)),
    Path("fwd:gluon-docs-persistent", "fwd", (space.WS_DOCS,), ("_attn_fwd_ws",), True),
]
BWD_PATHS = [
    Path("bwd:pointer", "bwd", (BwdConfig(64, 64, 4, 2, 64, 64, 4, 2), BwdConfig(32, 64, 4, 1, 64, 32, 4, 1)),
         ("_attn_bwd_dkdv", "_attn_bwd_dq")),
    Path("bwd:pointer-atomic", "bwd", (BwdConfig(32, 64, 4, 2, 64, 32, 4, 1, atomic_dq=True),
                                       BwdConfig(32, 32, 4, 1, 64, 32, 4, 1, atomic_dq=True)), ("_attn_bwd_dkdv",)),
    Path("bwd:tma", "bwd", (BwdConfig(64, 64, 4, 2, 128, 64, 8, 3, tma=True),
                            BwdConfig(64, 64, 8, 2, 64, 64, 8, 2, tma=True),
                            BwdConfig(32, 64, 4, 1, 64, 32, 4, 1, tma=True)), ("_attn_bwd_dkdv_tma", "_attn_bwd_dq_tma")),
    Path("bwd:tma-split-dq_regs", "bwd", (BwdConfig(32, 64, 4, 2, 64, 64, 4, 2, tma=True, split_dkdv=True, dq_regs=True),
                                          BwdConfig(32, 64, 4, 1, 64, 32, 4, 1, tma=True, split_dkdv=True, dq_regs=True)),
         ("_attn_bwd_dkdv_tma", "_attn_bwd_dq_tma")),
    Path("bwd:tma-atomic", "bwd", (BwdConfig(64, 64, 4, 2, 64, 64, 4, 2, tma=True, atomic_dq=True),
                                   BwdConfig(32, 64, 4, 1, 64, 32, 4, 1, tma=True, atomic_dq=True)),
         ("_attn_bwd_dkdv_tma",)),
    # both Gluon passes take the two-tile head dims (80, 96: bwd:gluon, their default since
    # session 56; 192: bwd:gluon-roles-dq, its default since session 58) as the one-tile ones (64, 128)
    Path("bwd:gluon", "bwd", (space.WS_BWD_DEFAULT,), ("_attn_bwd_dkdv_ws", "_attn_bwd_dq_ws")),
    Path("bwd:gluon-dkdv", "bwd", (space.WS_BWD_DKDV_M64,), ("_attn_bwd_dkdv_ws", "_attn_bwd_dq_tma")),
    # 128 query rows per ring slot: head dims up to 64 only (hd64's default since session 63)
    Path("bwd:gluon-dkdv-m128", "bwd", (space.WS_BWD_DEFAULT_HD64,), ("_attn_bwd_dkdv_ws", "_attn_bwd_dq_tma")),
    Path("bwd:gluon-roles", "bwd", (space.WS_BWD_ROLES,), ("_attn_bwd_dkdv_ws", "_attn_bwd_dq_tma")),
    # split roles beside the Gluon dQ pass (hd192: Q and dO read from shared memory; up to hd128 in registers)
    Path("bwd:gluon-roles-dq", "bwd", (space.WS_BWD_ROLES_DQ,),
         ("_attn_bwd_dkdv_ws", "_attn_bwd_dq_ws")),
]
SM80_PATHS = [
    Path("sm80:default", "fwd", (), ("_attn_fwd", "_attn_bwd_dkdv"), target="sm80"),
    Path("sm80:fwd-pointer-lazy", "fwd", (FwdConfig(128, 64, 8, 2, lazy_rescale=True),
                                          FwdConfig(64, 32, 4, 2, lazy_rescale=True)), ("_attn_fwd",), target="sm80"),
    Path("sm80:bwd-atomic", "bwd", (BwdConfig(64, 32, 4, 1, 64, 32, 4, 1, atomic_dq=True),), ("_attn_bwd_dkdv",),
         target="sm80"),
]
PATHS = FWD_PATHS + BWD_PATHS + SM80_PATHS


@dataclass(frozen=True)
class Case:
    hd: int
    dtype: str
    sq: int
    sk: int
    mask: str  # "full" | "causal" | "window" | "softcap" | "causal-softcap"
    window: tuple[int, int]
    heads: str  # mha | gqa | mqa
    layout: str  # bhsd | bshd | packed
    path: str  # "default" or a Path name
    seed: int

    @property
    def id(self) -> str:
        w = f"{self.window[0]}_{self.window[1]}" if self.mask == "window" else ""
        return (f"hd{self.hd}-{self.dtype}-q{self.sq}-k{self.sk}-{self.mask}{w}-{self.heads}-{self.layout}"
                f"-{self.path}")

    @property
    def causal(self) -> bool:
        return self.mask.startswith("causal")

    @property
    def softcap(self) -> float:
        return 30.0 if "softcap" in self.mask else 0.0

    @property
    def window_size(self) -> tuple[int, int]:
        return self.window if self.mask == "window" else (-1, -1)

    def problem(self, docs: tuple[list[int], list[int]] | None = None) -> Problem:
        """The case as an attngen.problem.Problem: batch 2 dense, or the documents `docs` (query
        lengths, key lengths) packed."""
        hq, hkv = HEADS[self.heads]
        shape = dict(heads_q=hq, heads_kv=hkv, head_dim_qk=self.hd, head_dim_v=self.hd, dtype=self.dtype,
                     causal=self.causal, window=self.window_size, softcap=self.softcap)
        if self.layout == "packed":
            return Problem.packed_documents(*docs, **shape)
        return Problem(2, seqlen_q=self.sq, seqlen_k=self.sk, layout=self.layout, **shape)


def _mask_kind(c: Case) -> str:
    return "sliding_window" if c.mask == "window" else ("causal" if c.causal else "none")


def kernel_spec(c: Case, family: str, target: str = "sm90") -> KernelSpec:
    hq, hkv = HEADS[c.heads]
    return KernelSpec(family, c.dtype, target, c.hd, c.hd, hq // hkv, _mask_kind(c), c.softcap > 0,
                      c.layout == "packed")


TARGET_ONLY = "target only"  # pick() of a path that forces its target, not a config


def pick(path: Path, c: Case):
    """The first of the path's configs the validity filter takes for the case's kernel
    (TARGET_ONLY for a path without configs), or None."""
    if path.packed is not None and path.packed != (c.layout == "packed"):
        return None
    if not path.configs:
        return TARGET_ONLY
    spec = kernel_spec(c, path.family, path.target)
    check = space.check_fwd if path.family == "fwd" else space.check_bwd
    return next((cfg for cfg in path.configs if check(spec, cfg) is None), None)


PATHS_BY_NAME = {p.name: p for p in PATHS}
POINTER = {"fwd": ("_attn_fwd",), "bwd": ("_attn_bwd_dkdv",)}


def routed_to_decode(c: Case) -> bool:
    """A dense call with a short query on a long KV, which attention() gives to the decode family
    unless a forward config is forced (attngen.runtime.kvcache.routes_to_decode)."""
    return (c.layout != "packed" and 0 < c.sq <= MAX_QUERY
            and c.sk >= max(kvcache.MIN_KEYS, kvcache.MIN_KEYS_PER_QUERY * c.sq))


def expected_kernels(path: Path, c: Case) -> tuple[str, ...]:
    """The kernels a forced path must launch: its own; the pointer kernels where rows are not
    16-byte aligned (head dims that are not multiples of 8), which the copy engine cannot address
    (the launchers' fallback, the only path such calls have); a target's default path on a shape
    attention() routes to the decode family: its forward is the decode kernel."""
    if not path.configs and path.family == "fwd" and routed_to_decode(c):
        return ("_attn_decode",) + path.kernels[1:]
    if c.hd % 8 and not path.kernels[0] in POINTER[path.family]:
        return POINTER[path.family]
    return path.kernels


def _draw(rng: random.Random, hd: int, path: str, packed_ok: bool = True) -> Case:
    sq, sk = rng.choice(SEQLENS)
    mask = rng.choice(["full", "causal", "window", "softcap", "causal-softcap"])
    window = (rng.randint(0, 300), rng.choice([0, rng.randint(0, 300)]))
    layout = rng.choice(["bhsd", "bshd", "packed"] if packed_ok else ["bhsd", "bshd"])
    return Case(hd, rng.choice(list(DTYPES)), sq, sk, mask, window, rng.choice(list(HEADS)), layout,
                path, rng.randrange(1 << 30))


def default_cases() -> list[Case]:
    """Every head dim through the dispatcher's own choice, twice: one host-bound shape (the plan's
    downgrade to the pointer kernels) and one drawn from SEQLENS."""
    rng = random.Random(SEED)
    out = []
    for hd in HEAD_DIMS:
        small = _draw(rng, hd, "default")
        out.append(dataclasses.replace(small, sq=113, sk=203, layout=rng.choice(["bhsd", "bshd"])))
        out.append(_draw(rng, hd, "default"))
    return out


def _forced_case(rng: random.Random, hd: int, path: Path) -> Case | None:
    """A case on which `path` has a valid config (packed documents long and even enough for the
    persistent Gluon walk when the path is that one), or None."""
    for _ in range(40):
        c = _draw(rng, hd, path.name, packed_ok=path.packed is not False)
        if path.packed:
            c = dataclasses.replace(c, layout="packed", sq=1024, sk=1024)
        if path.packed is False and c.layout == "packed":
            continue
        if pick(path, c) is not None:
            return c
    return None


def forced_cases(head_dims) -> list[Case]:
    rng = random.Random(SEED + 1)
    out = []
    for hd, path in itertools.product(head_dims, PATHS):
        c = _forced_case(rng, hd, path)
        if c is not None:
            out.append(c)
    return out


def sweep_cases(path: str, hd: int, n: int) -> list[Case]:
    """`n` cases of one forced path at one head dim, every mask, layout and head layout the path
    takes (those it refuses are skipped), seqlens drawn from SEQLENS: a path the default newly
    takes gets more than FORCED's one case per head-dim class."""
    rng = random.Random(SEED + 2)
    out, combos = [], list(itertools.product(("full", "causal", "window", "causal-softcap"),
                                             ("bhsd", "bshd", "packed"), HEADS))
    rng.shuffle(combos)
    for mask, layout, heads in combos:
        c = dataclasses.replace(_draw(rng, hd, path), mask=mask, layout=layout, heads=heads)
        if pick(PATHS_BY_NAME[path], c) is not None and len(out) < n:
            out.append(c)
    return out


DEFAULT = default_cases()
FORCED = forced_cases(CLASSES)
FULL = forced_cases(HEAD_DIMS)
# hd64's backward default since session 63: the Gluon dK/dV pass with 128 query rows per ring slot
SWEEPS = sweep_cases("bwd:gluon-dkdv-m128", 64, 24)


# --------------------------------------------------------------------------------------------------


def _docs(c: Case, rng: random.Random) -> tuple[list[int], list[int]]:
    """Document lengths (query, key) of a packed case: three documents around sq / sk tokens, the
    persistent Gluon path's equal 1024-token ones."""
    if c.path == "fwd:gluon-docs-persistent":
        return [1024, 1024], [1024, 1024]
    lq = [max(1, c.sq - rng.randint(0, c.sq // 2)) for _ in range(3)]
    lk = [max(1, c.sk - rng.randint(0, c.sk // 2)) for _ in range(3)]
    return lq, lk


def _poison(nbytes: int, device: str) -> None:
    """Fill the caching allocator's free memory with NaN, so an output element a kernel leaves
    unwritten shows as NaN instead of a stale right answer."""
    if device != "cuda":
        return
    t = torch.empty(max(nbytes, 1 << 20) // 4, dtype=torch.float32, device=device)
    t.fill_(float("nan"))
    del t


def run_case(c: Case, records: list | None = None, device: str = "cuda") -> None:
    """Run case `c` (forward with LSE, backward) on `device` and check it; append its record to
    `records`. The CPU interpreter tests run the pointer paths through it too."""
    dtype = DTYPES[c.dtype]
    rng = random.Random(c.seed)
    packed = c.layout == "packed"
    if packed:
        lq, lk = _docs(c, rng)
    problem = c.problem((lq, lk) if packed else None)
    q, k, v = problem.make_inputs(device, seed=c.seed, mults=(4.0 if c.softcap else 1.0, 1.0, 1.0),
                                  requires_grad=True)
    g = torch.Generator(device=device).manual_seed(c.seed + 1)
    kw = dict(causal=c.causal, window_size=c.window_size, softcap=c.softcap)
    forced, target = {}, None
    if c.path != "default":
        path = PATHS_BY_NAME[c.path]
        cfg = pick(path, c)
        if cfg is not TARGET_ONLY:
            forced[path.family] = cfg
        if path.target != "sm90":
            target = path.target
    api.clear_plans()
    _poison(4 * q.numel() * 8, device)
    with contextlib.ExitStack() as scopes:
        if target:
            scopes.enter_context(dispatch.forced_target(target))
        scopes.enter_context(dispatch.forced_config(**forced))
        if packed:
            cu_q, cu_k = problem.cu_seqlens(device)
            out, lse = attngen.attention_varlen(q, k, v, cu_q, cu_k, max(lq), max(lk), return_lse=True, **kw)
        else:
            out, lse = attngen.attention(q, k, v, layout=c.layout, return_lse=True, **kw)
        dout = torch.randn(out.shape, generator=g, device=device, dtype=torch.float32).to(dtype)
        _poison(4 * (q.numel() + k.numel() + v.numel()) * 4, device)
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
        if device == "cuda":
            torch.cuda.synchronize()
    launched = api.launched()
    ran = [n for n, _ in launched["fwd"] + launched["bwd"]]

    leaves64 = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    out64, lse64 = problem.reference(*leaves64)
    g64 = torch.autograd.grad(out64, leaves64, dout.double())
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    out_pt, _ = problem.reference(*leaves, upcast=False)
    g_pt = torch.autograd.grad(out_pt, leaves, dout)

    ratios, failure = {}, None
    try:
        if c.path != "default":
            missing = [n for n in expected_kernels(PATHS_BY_NAME[c.path], c) if n not in ran]
            assert not missing, f"{c.id}: forced {forced}, but {missing} did not run (ran {ran})"
        for name, got, want, pt, factor in (("out", out, out64, out_pt, 2.0),
                                            *((n, a, b, p, 3.0) for n, a, b, p in
                                              zip(("dq", "dk", "dv"), (dq, dk, dv), g64, g_pt))):
            err, pt_err = assert_flash_rule(f"{c.id}/{name}", got, want, pt, factor, atol=ATOL)
            ratios[name] = err / (factor * pt_err + ATOL)  # <= 1 passes
        assert_lse_close(f"{c.id}/lse", lse, lse64.float(), rtol=1e-3, atol=1e-3)
        ratios["lse"] = max_err(lse.masked_fill(torch.isinf(lse), 0), lse64.masked_fill(torch.isinf(lse64), 0))
    except AssertionError as exc:
        failure = str(exc)
    if records is not None:
        records.append(record := {
            "head_dim": c.hd, "dtype": c.dtype, "sq": c.sq, "sk": c.sk, "mask": c.mask,
            "window": list(c.window_size), "layout": c.layout, "heads": list(HEADS[c.heads]),
            "path": c.path, "target": target or "sm90",
            "knobs": {f: dataclasses.asdict(cfg) for f, cfg in forced.items()},
            "kernels": ran, "passed": failure is None,
            "max_err_ratio": round(max((v for n, v in ratios.items() if n != "lse"), default=float("nan")), 4),
            "lse_max_err": ratios.get("lse"), "error": failure})
        _write_record(record)
    if failure:
        raise AssertionError(failure)


def _write_record(record: dict) -> None:
    """Append one record to this process's JSONL file under $ATTNGEN_GRID_RESULTS at once (a later
    case may lose the CUDA context; tests/gpu/conftest.py merges the files)."""
    path = os.environ.get(RESULTS_ENV)
    if path:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(f"{path}.{worker}.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")


def run_isolated(c: Case, records: list) -> None:
    """run_case on the GPU; a CUDA error (an illegal memory access loses the process's CUDA
    context, so every later case in it would fail too) is recorded as this case's failure and ends
    the process: pytest-xdist reports the test as failed and starts a fresh worker."""
    try:
        run_case(c, records)
    except torch.AcceleratorError as exc:
        _write_record({"head_dim": c.hd, "dtype": c.dtype, "sq": c.sq, "sk": c.sk, "mask": c.mask,
                       "window": list(c.window_size), "layout": c.layout, "heads": list(HEADS[c.heads]),
                       "path": c.path, "knobs": {}, "kernels": [], "passed": False,
                       "max_err_ratio": None, "error": f"CUDA error: {str(exc).splitlines()[0]}"})
        if os.environ.get("PYTEST_XDIST_WORKER"):
            os._exit(3)
        raise


@pytest.fixture(scope="module")
def grid_records():
    return []


@pytest.mark.parametrize("case", DEFAULT, ids=lambda c: c.id)
def test_default_dispatch(case, grid_records):
    run_isolated(case, grid_records)


@pytest.mark.parametrize("case", FORCED, ids=lambda c: c.id)
def test_forced_path(case, grid_records):
    run_isolated(case, grid_records)


@pytest.mark.parametrize("case", SWEEPS, ids=lambda c: c.id)
def test_forced_path_sweep(case, grid_records):
    run_isolated(case, grid_records)


@pytest.mark.gpu_full
@pytest.mark.parametrize("case", FULL, ids=lambda c: c.id)
def test_forced_path_full(case, grid_records):
    run_isolated(case, grid_records)
