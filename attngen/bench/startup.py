"""Where a process's first kernel calls spend their time, and whether they compile: Triton's compile
(each stage, from its compilation listener; the triton_key() hash inside it), ptxas, the C compiler
building launchers, the C modules' builds or loads, module loads into the GPU (cuModuleLoadData),
the compiled-kernel packs' loading and attngen's own kernel resolution (spec, module, config).

    probe = StartupProbe().install()
    with probe.phase("forward"):
        out = attngen.attention(q, k, v, causal=True); torch.cuda.synchronize()
    probe.uninstall(); probe.phases["forward"]  # seconds and counts, below

Used by benchmarks/tools/first_call.py and the pack tests (they assert ptxas and the C compiler
never ran). Times are wall seconds summed per phase. The compile, the C modules, the module loads
and the pack loading are disjoint, and `other_s` is the rest of the phase's wall time (attngen's
planning, Triton's JIT binding, the launches and the kernels themselves). Nested in them:
ptxas_s and the stages in the compile, c_compiler_s in the C modules, triton_key_s wherever it
first runs (the first compile; with a pack, its loading), pack_load_s in attngen_load_module_s
(the first module loads the packs), which is in attngen_resolve_s."""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import time
from collections import defaultdict


class StartupProbe:
    """Wraps Triton's and attngen's start-up steps (install / uninstall) and sums their times and
    counts into the current phase (`phases[name]`)."""

    COMPILERS = ("gcc", "cc", "clang", "g++", "c++", "clang++")

    def __init__(self):
        self.phases: dict[str, dict] = {}
        self.current = "setup"
        self._undo: list = []
        self._listener_prev = None

    # ---- recording
    def _row(self) -> dict:
        return self.phases.setdefault(self.current, defaultdict(float))

    def add(self, key: str, seconds: float = 0.0, count: str | None = None) -> None:
        row = self._row()
        row[key] += seconds
        if count:
            row[count] += 1

    @contextlib.contextmanager
    def phase(self, name: str):
        """Record into phase `name` while the block runs; its wall time as wall_s."""
        before, self.current = self.current, name
        self._row()
        t0 = time.perf_counter()
        try:
            yield self
        finally:
            self.phases[name]["wall_s"] += time.perf_counter() - t0
            self.current = before

    def summary(self) -> dict:
        """phase -> its numbers (seconds rounded to 0.1 ms), with other_s."""
        out = {}
        for name, row in self.phases.items():
            row = dict(row)
            if "wall_s" in row:
                row["other_s"] = row["wall_s"] - sum(row.get(k, 0.0) for k in
                                                     ("triton_compile_s", "c_modules_s", "module_load_s",
                                                      "pack_load_s"))
            out[name] = {k: (round(v, 4) if k.endswith("_s") else int(v)) for k, v in sorted(row.items())}
        return out

    # ---- wrapping
    def _wrap(self, owner, name: str, key: str, count: str | None = None, label=None) -> None:
        original = getattr(owner, name)
        probe = self

        @functools.wraps(original)
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                probe.add(key, time.perf_counter() - t0, count)
                if label is not None:
                    probe._row()[f"{count}:{label(*args, **kwargs)}"] += 1

        setattr(owner, name, timed)
        self._undo.append((owner, name, original))

    def install(self) -> "StartupProbe":
        """Wrap Triton's compile, ptxas, C builds and module loads, attngen's resolution and pack
        loading, and subprocess.Popen (every program a phase starts is counted by name)."""
        import triton
        import triton.compiler
        import triton.compiler.compiler
        import triton.runtime.build
        import triton.runtime.cache
        from triton import knobs
        from triton.backends.nvidia import compiler as nv_compiler
        from triton.backends.nvidia import driver as nv_driver

        from attngen.runtime import loader, packs, plan

        # JITFunction takes `compile` from the triton.compiler package when it first runs
        for owner in (triton, triton.compiler, triton.compiler.compiler):
            self._wrap(owner, "compile", "triton_compile_s", "compile_calls")
        self._wrap(triton.runtime.cache, "triton_key", "triton_key_s")
        self._wrap(nv_compiler.CUDABackend, "make_cubin", "ptxas_s", "ptxas_runs")
        self._wrap(triton.runtime.build, "_build", "c_compiler_s", "c_compiler_runs",
                   label=lambda name, *a, **k: name)
        self._wrap(nv_driver, "compile_module_from_src", "c_modules_s", "c_modules",
                   label=lambda *a, **k: k.get("name", a[1] if len(a) > 1 else "?"))
        self._wrap(loader, "load", "attngen_load_module_s")
        self._wrap(plan.Plan, "resolve", "attngen_resolve_s")
        self._wrap(packs, "autoload", "pack_load_s")
        self._listener_prev = knobs.compilation.listener
        knobs.compilation.listener = self._listen
        knobs.runtime.kernel_load_start_hook.add(self._load_start)
        knobs.runtime.kernel_load_end_hook.add(self._load_end)
        self._popen()
        return self

    def uninstall(self) -> None:
        from triton import knobs

        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()
        knobs.compilation.listener = self._listener_prev
        knobs.runtime.kernel_load_start_hook.remove(self._load_start)
        knobs.runtime.kernel_load_end_hook.remove(self._load_end)

    def _listen(self, *, src, metadata, metadata_group, times, cache_hit) -> None:
        if self._listener_prev is not None:
            self._listener_prev(src=src, metadata=metadata, metadata_group=metadata_group, times=times,
                                cache_hit=cache_hit)
        row = self._row()
        row["cache_hits" if cache_hit else "compiles"] += 1
        if not cache_hit:
            row["stage_ir_init_s"] += times.ir_initialization / 1e6
            for stage, us in times.lowering_stages:
                row[f"stage_{stage}_s"] += us / 1e6
            row["stage_store_s"] += times.store_results / 1e6

    def _load_start(self, *args) -> None:
        self._t_load = time.perf_counter()

    def _load_end(self, *args) -> None:
        self.add("module_load_s", time.perf_counter() - self._t_load, "module_loads")

    def _popen(self) -> None:
        probe, base = self, subprocess.Popen

        class Counted(base):
            def __init__(self, args, *rest, **kw):
                argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
                prog = os.path.basename(str(argv[0])) if argv else "?"
                version = len(argv) > 1 and str(argv[1]) == "--version"
                probe._row()[f"programs:{prog}{' --version' if version else ''}"] += 1
                super().__init__(args, *rest, **kw)

        subprocess.Popen = Counted
        self._undo.append((subprocess, "Popen", base))


def compiled_anything(row: dict) -> list[str]:
    """What in a phase's numbers shows that it compiled: Triton compiles, ptxas runs (its
    --version aside), C compiler runs; empty when it compiled nothing."""
    found = [f"{k}={row[k]}" for k in ("compiles", "ptxas_runs", "c_compiler_runs") if row.get(k)]
    found += [f"{k}={v}" for k, v in row.items() if k.startswith("programs:")
              and (k == "programs:ptxas" or k.split(":", 1)[1] in StartupProbe.COMPILERS)]
    return found
