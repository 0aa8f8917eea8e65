"""Power and SM clock while an fp8 bench provider runs back to back, so that kernels can be compared in
clock cycles as well as in seconds: a kernel that is capped by the board's power limit runs at a
lower clock, and a faster schedule buys it nothing. For each row and provider: the provider runs
for `--seconds` (calls launched back to back, a sync every 20 calls) after a 300 ms busy wait;
`nvidia-smi --query-gpu` is sampled every 50 ms in the background (read-only: no setting is
touched); the report gives µs a call in that window, the mean power and SM clock over its middle
half, the throttle reasons seen there, and megacycles a call (µs x MHz / 1e6).

    python3 benchmarks/tools/fp8_power.py OUT.json [--seconds 3]   # needs a GPU (and nvidia-cudnn-frontend)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import threading
import time

import torch

from attngen.bench import fp8 as bench_fp8
from attngen.devices import busy_gpu

PROVIDERS = ["attngen-fp8", "attngen-fp8-kernel", "cudnn-fp8", "triton-fp8", "attngen", "cudnn"]
ROWS = [bench_fp8.Fp8Case(16384, False), bench_fp8.Fp8Case(16384, True), bench_fp8.Fp8Case(4096, False),
        bench_fp8.Fp8Case(16384, False, 256)]
QUERY = "power.draw,clocks.sm,clocks_event_reasons.active"


class Sampler:
    """nvidia-smi's readings, each stamped with this process's clock when its line arrived."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float, float, str]] = []
        self.proc = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
                                      "-lms", "50"], stdout=subprocess.PIPE, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            parts = [p.strip() for p in line.split(",")]
            try:
                self.samples.append((time.perf_counter(), float(parts[0]), float(parts[1]), parts[2]))
            except (ValueError, IndexError):
                continue

    def window(self, t0: float, t1: float) -> list[tuple[float, float, float, str]]:
        return [s for s in self.samples if t0 <= s[0] <= t1]

    def stop(self) -> None:
        self.proc.terminate()


def sustained(fn, seconds: float) -> tuple[float, float, float]:
    """(µs a call, start, end) of `fn` run back to back for about `seconds`."""
    with torch.no_grad():
        fn()
        torch.cuda.synchronize()
        busy_gpu("cuda")
        n = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for _ in range(20):
                fn()
            n += 20
            torch.cuda.synchronize()
        t1 = time.perf_counter()
    return (t1 - t0) / n * 1e6, t0, t1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    sampler = Sampler()
    time.sleep(1.0)
    doc = {"what": __doc__.split("\n\n")[0].replace("\n", " "), "gpu": torch.cuda.get_device_name(),
           "seconds": args.seconds, "query": QUERY, "rows": {}}
    try:
        for case in ROWS:
            calls = bench_fp8._providers(case, torch.device("cuda"))
            row = doc["rows"][case.name] = {}
            for name in PROVIDERS:
                if calls.get(name) is None:
                    continue
                us, t0, t1 = sustained(calls[name], args.seconds)
                quarter = (t1 - t0) / 4
                mid = sampler.window(t0 + quarter, t1 - quarter)
                watts = sum(s[1] for s in mid) / max(len(mid), 1)
                mhz = sum(s[2] for s in mid) / max(len(mid), 1)
                row[name] = {"us": round(us, 1), "tflops": round(case.flops / us / 1e6, 1),
                             "watts": round(watts, 1), "sm_mhz": round(mhz), "samples": len(mid),
                             "mcycles": round(us * mhz / 1e6, 3),
                             "reasons": sorted({s[3] for s in mid})}
                print(case.name, name, json.dumps(row[name]), flush=True)
        # the reference: an e4m3 matmul (torch._scaled_mm, 8192^3, bf16 out)
        a = torch.randn(8192, 8192, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(8192, 8192, device="cuda").to(torch.float8_e4m3fn).t()
        one = torch.ones((), device="cuda")
        us, t0, t1 = sustained(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                               args.seconds)
        quarter = (t1 - t0) / 4
        mid = sampler.window(t0 + quarter, t1 - quarter)
        mhz = sum(s[2] for s in mid) / max(len(mid), 1)
        doc["rows"]["matmul-e4m3-8192"] = {"torch._scaled_mm": {
            "us": round(us, 1), "tflops": round(2 * 8192 ** 3 / us / 1e6, 1),
            "watts": round(sum(s[1] for s in mid) / max(len(mid), 1), 1), "sm_mhz": round(mhz), "samples": len(mid),
            "mcycles": round(us * mhz / 1e6, 3), "reasons": sorted({s[3] for s in mid})}}
        print("matmul", json.dumps(doc["rows"]["matmul-e4m3-8192"]), flush=True)
    finally:
        sampler.stop()
    with open(args.out, "w") as fh:
        json.dump(doc, fh, indent=1)


if __name__ == "__main__":
    main()
