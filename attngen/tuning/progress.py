"""What a tuning run tells the user: configs as short text, one line per trial and per study
(Progress, for logs, tests and workers), bars on a terminal (RichProgress), and each study's
report."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from attngen.db import schema
from attngen.families import FAMILIES
from attngen.tuning.targets import Target

SHORT = {"block_m": "M", "block_n": "N", "num_warps": "w", "num_stages": "s", "dq_block_m": "dqM",
         "dq_block_n": "dqN", "dq_num_warps": "dqw", "dq_num_stages": "dqs", "atomic_dq": "atomic",
         "warp_specialize": "ws"}


def config_text(config: dict, family: str | None = None) -> str:
    """"M=128 N=64 w=8 s=3 tma=1": in the config class's field order when the family is known."""
    if family in FAMILIES:
        order = [f.name for f in dataclasses.fields(FAMILIES[family].config)]
        config = {k: config[k] for k in sorted(config, key=lambda k: (k not in order,
                                                                       order.index(k) if k in order else 0, k))}
    return " ".join(f"{SHORT.get(k, k)}={int(v) if isinstance(v, bool) else v}" for k, v in config.items())


def unit(family: str | None) -> str:
    """What a family's trials measure: "TFLOP/s", or "GB/s" (decode), from its tuning hooks."""
    if family in FAMILIES and FAMILIES[family].hooks:
        return FAMILIES[family].tuning_hooks().unit
    return "TFLOP/s"


class Progress:
    """Plain lines (logs, tests, workers); RichProgress draws bars when stdout is a terminal."""

    def __init__(self, prefix: str = "", quiet: bool = False):
        self.prefix, self.quiet = prefix, quiet

    def say(self, text: str) -> None:
        if not self.quiet:
            print(f"{self.prefix}{text}", flush=True)

    def start(self, index: int, total: int, target: Target, budget: int, measured: int) -> None:
        self.say(f"[{index + 1}/{total}] {target.label}: {measured}/{budget} configs measured")

    def trial(self, target: Target, measured: int, budget: int, cfg: dict, outcome, best) -> None:
        short, u = config_text(cfg, target.spec.family), unit(target.spec.family)
        if outcome.status == "ok":
            what = f"{outcome.time_ms:.4f} ms {outcome.tflops:.4g} {u}"
        else:
            what = f"{outcome.status}: {(outcome.error or '')[:120]}"
        best_s = f"; best {best[0]:.4f} ms {best[1]:.4g} {u}" if best else ""
        self.say(f"  {measured}/{budget} {short}: {what}{best_s}")

    def finish(self, target: Target, report: "TargetReport") -> None:
        self.say(f"  done {target.label}: {report.line()}")

    def close(self) -> None:
        pass


class RichProgress(Progress):
    def __init__(self, total: int):
        super().__init__()
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress as _P, TextColumn,
                                   TimeElapsedColumn, TimeRemainingColumn)

        self.bar = _P(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("{task.fields[best]}"), TimeElapsedColumn(), TextColumn("ETA"),
                      TimeRemainingColumn())
        self.bar.start()
        self.all = self.bar.add_task("studies", total=total, best="")
        self.task = None

    def say(self, text: str) -> None:
        self.bar.console.print(text)

    def start(self, index, total, target, budget, measured) -> None:
        if self.task is not None:
            self.bar.remove_task(self.task)
        self.task = self.bar.add_task(target.label, total=budget, completed=measured, best="")

    def trial(self, target, measured, budget, cfg, outcome, best) -> None:
        best_s = f"best {best[0]:.4f} ms {best[1]:.0f} {unit(target.spec.family)}" if best else ""
        self.bar.update(self.task, completed=measured, best=best_s)
        if outcome.status != "ok":
            text = config_text(cfg, target.spec.family)
            self.bar.console.print(f"  {target.label} {text}: {outcome.status}: "
                                   f"{(outcome.error or '')[:100]}")

    def finish(self, target, report) -> None:
        self.bar.advance(self.all)
        self.bar.console.print(f"{target.label}: {report.line()}")

    def close(self) -> None:
        self.bar.stop()


@dataclass
class TargetReport:
    target: Target
    measured: int = 0
    best_ms: float | None = None
    best_tflops: float | None = None
    best_config: dict | None = None
    default_ms: float | None = None
    default_tflops: float | None = None
    skipped: str | None = None

    def line(self) -> str:
        if self.skipped:
            return f"skipped: {self.skipped}"
        if self.best_ms is None:
            return f"{self.measured} measured, no config passed"
        u = unit(self.target.spec.family)
        gain = (f", {self.default_ms / self.best_ms - 1:+.1%} vs default "
                f"{self.default_tflops:.4g} {u}") if self.default_ms else ""
        return (f"{self.measured} measured; winner {self.best_ms:.4f} ms {self.best_tflops:.4g} "
                f"{u} {config_text(self.best_config, self.target.spec.family)}{gain}")


def summary(reports: list[TargetReport], seconds: float, opts) -> None:
    """The end of a run: one line per study."""
    if opts.quiet:
        return
    print(f"tuned {len(reports)} studies in {seconds:.0f} s into {schema.redact(opts.url)}")
    for r in reports:
        print(f"  {r.target.label}: {r.line()}")
