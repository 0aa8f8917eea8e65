"""One concurrent writer process of tests/db/test_db_concurrency.py:

    python tests/db/_writer.py URL WORKER N SYNC_DIR OUT_JSON

Opens (creating if needed) the database, waits at a file barrier until every writer is ready, then
in N transactions adds a trial for one of three buckets (some failed) and offers the ok ones as
winners. Writes what it did to OUT_JSON. Imports attngen.db without attngen/__init__.py (which
imports torch): the writers start in a fraction of a second, so they really overlap.
"""

import json
import random
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
pkg = types.ModuleType("attngen")
pkg.__path__ = [str(ROOT / "attngen")]
sys.modules.setdefault("attngen", pkg)

from attngen.db import store as dbs  # noqa: E402

BUCKETS = ("q1024_k1024_bh32", "q4096_k4096_bh32", "q4096_k4096_bh128")
DEVICE = dict(device_class="h100", gpu_name="NVIDIA H200", capability="9.0", driver="570.00",
              cuda_version="12.8", torch_version="2.11.0", triton_version="3.6.0")


def main() -> None:
    url, worker, n, sync, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]), sys.argv[5]
    rng = random.Random(worker)
    (sync / f"ready{worker}").touch()
    while not (sync / "go").exists():
        time.sleep(0.005)
    st = dbs.Store(url, "create")  # all writers race to create the schema, too
    done = []
    for i in range(n):
        bucket = BUCKETS[rng.randrange(len(BUCKETS))]
        status = "failed" if rng.random() < 0.2 else "ok"
        ms = round(rng.uniform(1.0, 2.0), 6) if status == "ok" else None
        with st.session() as s:
            dev = dbs.find_or_add_device(s, DEVICE)
            ker = dbs.find_or_add_kernel(s, "attn_fwd_bf16_hd128_gqa4_causal_sm90", "h0", "fwd", {"x": 1})
            b = dbs.find_or_add_bucket(s, bucket)
            t = dbs.add_trial(s, kernel=ker, device=dev, bucket=b, config={"w": worker, "i": i},
                              status=status, shape={}, time_ms=ms, tflops=100.0 / ms if ms else None,
                              error=None if ms else "fake failure")
            won = dbs.offer_winner(s, t, "h100", 1.5, 66.0) if status == "ok" else False
            done.append({"uid": t.uid, "bucket": bucket, "status": status, "time_ms": ms, "won": won})
    st.close()
    Path(out).write_text(json.dumps(done))


if __name__ == "__main__":
    main()
