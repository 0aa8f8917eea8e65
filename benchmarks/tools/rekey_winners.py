"""Re-key a tuning database's winners from template hashes to kernel hashes, where the kernel is unchanged.

    python3 benchmarks/tools/rekey_winners.py [--db tuning_db/attngen.sqlite] [--base 103bbcd] [--check]

Winners used to be keyed by the family's template hash (TEMPLATE_HASH of the generated module), and
are now keyed by the generated module's content hash (KERNEL_HASH, codegen.naming.kernel_hash).
A kernel row (uri, hash) with winners is re-keyed only when all of these hold:
  * its hash is the TEMPLATE_HASH of the uri's module in generated/ at the base commit (the winners
    were current there; a row already stale stays stale),
  * the uri's module now (generated/ of this tree) has a KERNEL_HASH equal to the hash of its
    source (the file is what the build writes),
  * the two modules' kernels are token-identical up to header and ABI (kernel_identity.compare),
so every winner keeps serving exactly the code it was tuned on. Rows that fail a test are listed
and left as they are. --check changes nothing and fails (exit 1) unless every winner's kernel row
names a module of generated/ by its current KERNEL_HASH.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_identity import _git_show, compare  # noqa: E402

from attngen.codegen.naming import kernel_hash  # noqa: E402

GENERATED = "generated"
KERNELS = "attngen_kernels"
WINNERS = "attngen_winners"


def _constant(source: str, name: str) -> str | None:
    for line in source.splitlines():
        if line.startswith(f"{name} = "):
            return json.loads(line.split(" = ", 1)[1])
    return None


def current_modules(root: Path) -> dict[str, str]:
    """uri -> source of its module in generated/ (this tree)."""
    kernels = json.loads((root / GENERATED / "manifest.json").read_text())["kernels"]
    return {uri: (root / GENERATED / ent["file"]).read_text() for uri, ent in kernels.items()}


def winner_kernels(conn: sqlite3.Connection) -> list[tuple[int, str, str, int]]:
    """(kernel id, uri, hash, winners) of every kernel row with winners."""
    return conn.execute(f"SELECT k.id, k.uri, k.template_hash, COUNT(w.id) FROM {KERNELS} k "
                        f"JOIN {WINNERS} w ON w.kernel_id = k.id GROUP BY k.id ORDER BY k.uri").fetchall()


def check(conn: sqlite3.Connection, now: dict[str, str]) -> list[str]:
    """One line per winner kernel row that finds no module of generated/ by its hash."""
    bad = []
    for _, uri, h, n in winner_kernels(conn):
        src = now.get(uri)
        if src is None:
            bad.append(f"{uri} ({n} winners): no module in generated/")
        elif _constant(src, "KERNEL_HASH") != h:
            bad.append(f"{uri} ({n} winners): keyed {h}, the module's KERNEL_HASH is {_constant(src, 'KERNEL_HASH')}")
    return bad


def rekey(conn: sqlite3.Connection, now: dict[str, str], base: str) -> tuple[list[str], list[str]]:
    """Re-key what may be re-keyed (see the module docstring): (done, refused) lines."""
    base_kernels = json.loads(_git_show(base, f"{GENERATED}/manifest.json"))["kernels"]
    done, refused = [], []
    for kid, uri, h, n in winner_kernels(conn):
        if uri not in base_kernels or uri not in now:
            refused.append(f"{uri}: no module at {base if uri not in base_kernels else 'this tree'}")
            continue
        old_src = _git_show(base, f"{GENERATED}/{base_kernels[uri]['file']}")
        new_src = now[uri]
        new_hash = _constant(new_src, "KERNEL_HASH")
        if h == new_hash:
            done.append(f"{uri}: already {h}")
            continue
        if _constant(old_src, "TEMPLATE_HASH") != h:
            refused.append(f"{uri}: keyed {h}, which is not its template hash at {base} (already stale)")
            continue
        if new_hash != kernel_hash(new_src):
            refused.append(f"{uri}: its module's KERNEL_HASH {new_hash} is not the hash of its source")
            continue
        why = compare(old_src, new_src)
        if why:
            refused.append(f"{uri}: kernels changed since {base}: {why}")
            continue
        clash = conn.execute(f"SELECT id FROM {KERNELS} WHERE uri = ? AND template_hash = ?",
                             (uri, new_hash)).fetchone()
        if clash:
            refused.append(f"{uri}: a kernel row keyed {new_hash} exists already (id {clash[0]})")
            continue
        conn.execute(f"UPDATE {KERNELS} SET template_hash = ? WHERE id = ?", (new_hash, kid))
        done.append(f"{uri}: {h} -> {new_hash} ({n} winners; kernels identical to {base})")
    return done, refused


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default="tuning_db/attngen.sqlite")
    ap.add_argument("--base", default="103bbcd")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    now = current_modules(Path.cwd())
    conn = sqlite3.connect(args.db, isolation_level=None)
    try:
        if not args.check:
            conn.execute("BEGIN")
            done, refused = rekey(conn, now, args.base)
            conn.execute("COMMIT")
            conn.execute("VACUUM")
            for line in done:
                print("re-keyed", line)
            for line in refused:
                print("left", line)
        bad = check(conn, now)
    finally:
        conn.close()
    for line in bad:
        print("stale", line)
    print(f"{len(winner_kernels(sqlite3.connect(args.db)))} winner kernel rows, {len(bad)} without their module")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
