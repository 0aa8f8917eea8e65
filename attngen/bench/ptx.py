"""Checks of a compiled kernel's PTX text (the probe's, attngen.bench.probe), in the standard
library only.

`unfenced_descriptor_loads`: TMA copies through a descriptor the kernel made itself (in global
scratch) that the issuing warp never acquired. A descriptor written through the generic proxy
is read by the copy engine through the tensormap proxy; `fence.proxy.tensormap::generic.acquire`
orders the executing thread's later tensormap reads after the write, and each warp that issues
copies through such a descriptor needs its own (the copy engine may otherwise use a stale copy:
docs/notes.md, session 60, the Gluon backward over packed documents). Warp-specialized
partitions show in the PTX as stretches that start with a `setmaxnreg`; an acquire counts for
the copies after it in its own stretch only.

`unfenced_barrier_inits`: mbarriers initialised (`mbarrier.init`, the generic proxy) with no
`fence.proxy.async` (or `fence.mbarrier_init`) between the last initialisation and the first
asynchronous copy or warp-specialized partition. The copy engine completes its bytes on the
barrier through the async proxy, and the CUDA programming guide's TMA example fences the
initialisation for it ("make initialized barrier visible in async proxy") before the block
synchronises.

`uninvalidated_barriers`: how many more `mbarrier.init` instructions than `mbarrier.inval` the
kernel has. An mbarrier's location is to be invalidated before it is put to any other use, and the
next program on the SM reuses the shared memory; Triton's own TMA lowering invalidates every
barrier it initialises, and the Gluon kernels invalidate theirs after the partitions join.
"""

from __future__ import annotations

import re

_STRETCH = re.compile(r"\bsetmaxnreg\.")
_ACQUIRE = re.compile(r"\bfence\.proxy\.tensormap::generic\.acquire\.\w+\s+\[\s*(%rd\d+)")
_DEF = re.compile(r"^\s*(?:@!?%p\d+\s+)?([a-z][\w.:]*)\s+(%rd\d+)\s*,\s*([^;]*);")
# TMA copies: a load names the descriptor second ([smem], [desc, {coords}], [mbarrier]); a store
# or reduce names it first ([desc, {coords}], [smem])
_TMA_LOAD = re.compile(r"\bcp\.async\.bulk\.tensor\.\S*shared::\w+\.global\S*\s+\[[^\]]*\]\s*,\s*\[\s*(%rd\d+)")
_TMA_STORE = re.compile(r"\bcp(?:\.reduce)?\.async\.bulk\.tensor\.\S*global\.shared\S*\s+\[\s*(%rd\d+)")


def unfenced_descriptor_loads(ptx: str) -> list[str]:
    """"line N: <instruction>" for each TMA copy through a kernel-made descriptor whose address
    no acquire fence of the same stretch (warp-specialized partition) covered before it.
    Descriptors passed as kernel parameters (`cvta.param`) need no fence and are skipped."""
    defs: dict[str, tuple[str, str]] = {}  # register -> (opcode, operands) of its last definition
    acquired: set[str] = set()  # addresses (registers) acquired in the current stretch
    out = []
    for n, line in enumerate(ptx.splitlines(), 1):
        if _STRETCH.search(line):
            acquired = set()
            continue
        m = _ACQUIRE.search(line)
        if m:
            acquired.add(m.group(1))
            continue
        t = _TMA_LOAD.search(line) or _TMA_STORE.search(line)
        if t:
            reg = t.group(1)
            op, args = defs.get(reg, ("", ""))
            if op.startswith("cvta.param") or op.startswith("ld.param"):
                continue  # a host descriptor
            addr = args.split(",")[0].strip() if op.startswith("cvta.global") else reg
            if addr not in acquired and reg not in acquired:
                out.append(f"line {n}: {line.strip()}")
            continue
        d = _DEF.match(line)
        if d:
            defs[d.group(2)] = (d.group(1), d.group(3))
    return out


_INIT = re.compile(r"\bmbarrier\.init\.")
_INIT_FENCE = re.compile(r"\bfence\.(?:proxy\.async\b|mbarrier_init\b)")
_ASYNC_USE = re.compile(r"\bcp(?:\.reduce)?\.async\.bulk\.|\bsetmaxnreg\.")


_INVAL = re.compile(r"\bmbarrier\.inval\.")


def uninvalidated_barriers(ptx: str) -> int:
    """`mbarrier.init` instructions in excess of `mbarrier.inval` ones (0: each one invalidated)."""
    return max(len(_INIT.findall(ptx)) - len(_INVAL.findall(ptx)), 0)


def unfenced_barrier_inits(ptx: str) -> list[str]:
    """"line N: <instruction>" of each `mbarrier.init` that reaches an asynchronous copy or a
    warp-specialized partition's start (`setmaxnreg`) with no proxy fence after it: the last
    initialisation of each such run is reported."""
    out, pending = [], None
    for n, line in enumerate(ptx.splitlines(), 1):
        if _INIT.search(line):
            pending = f"line {n}: {line.strip()}"
        elif _INIT_FENCE.search(line):
            pending = None
        elif pending and _ASYNC_USE.search(line):
            out.append(pending)
            pending = None
    return out
