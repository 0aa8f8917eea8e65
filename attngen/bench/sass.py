"""What the SASS of a compiled kernel says (attngen.bench.probe reads it on any machine): the
attention main loop's instruction mix, and uniform registers read where no path wrote them."""

from __future__ import annotations

import re


_SASS_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);")


def main_loop(sass: str) -> dict | None:
    """The attention main loop of a kernel's SASS: the smallest loop (a backward branch's body)
    that holds both matrix instructions (wgmma, or mma.sync's HMMA in the decode kernels) and
    exponentials. Its static instruction count (both sides of any
    branch inside it), the wgmma, ex2, bar.sync and local-memory instructions in it, and how many
    of its wgmma waits come before its first ex2 (a wait placed there holds the softmax until the
    matmuls it waits for are done). None when no loop holds both."""
    ins = [(int(a, 16), t.strip()) for a, t in _SASS_INSTRUCTION.findall(sass)]
    best = None
    for addr, text in ins:
        target = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", text)
        if not target or int(target.group(1), 16) >= addr:
            continue
        lo = int(target.group(1), 16)
        ops = [re.sub(r"^@!?U?P\w+\s+", "", t).split()[0] for a, t in ins if lo <= a <= addr]
        if any("GMMA" in o or o.startswith("HMMA") for o in ops) and "MUFU.EX2" in ops and (best is None or len(ops) < len(best)):
            best = ops
    if best is None:
        return None
    first_ex2 = best.index("MUFU.EX2")
    return {"instructions": len(best), "wgmma": sum("GMMA" in o for o in best),
            "hmma": sum(o.startswith("HMMA") for o in best),
            "ex2": best.count("MUFU.EX2"), "bar_sync": sum(o.startswith("BAR.SYNC") for o in best),
            "local_memory": sum(o.split(".")[0] in ("LDL", "STL") for o in best),
            "waits": sum(o.startswith("WARPGROUP.DEPBAR") for o in best),
            "waits_before_ex2": sum(o.startswith("WARPGROUP.DEPBAR") for o in best[:first_ex2])}


_UNIFORM_REGISTER = re.compile(r"\bUR(\d+)\b")
_DESCRIPTOR = re.compile(r"\b(g?desc)\[UR(\d+)\]")


def _uniform_access(op: str, args: str) -> tuple[list[int], list[int]]:
    """(read, written) uniform registers of one SASS instruction. A uniform-datapath instruction
    (U...) writes its first operand when that is URn, or its second after a predicate output
    (ULOP3.LUT UP0, UR4, ...); a .64 one reads and writes register pairs, a .WIDE multiply
    writes a pair and reads its addend as one. gdesc[URn] (a wgmma's
    descriptors) reads URn..URn+3 (A's pair and B's), only B's pair when A comes from registers;
    desc[URn] a pair; an address in brackets one register; the data of another .64 instruction
    (SYNCS.EXCH.64's value) a pair."""
    ops = [a.strip() for a in args.split(",")] if args else []
    uniform_op = op.startswith("U") or op.split(".")[0] in ("S2UR", "R2UR", "VOTEU", "REDUX", "LDCU")
    wide = 2 if ".64" in op else 1
    dest_at = None
    if ops and re.fullmatch(r"UR\d+", ops[0]):
        dest_at = 0
    elif uniform_op and len(ops) > 1 and re.fullmatch(r"!?UP(\d|T)", ops[0]) and re.fullmatch(r"UR\d+", ops[1]):
        dest_at = 1
    pair_out = wide if uniform_op else 1
    if ".WIDE" in op:  # (U)IMAD.WIDE: a 64-bit result, and its addend (the last operand) a pair
        pair_out = 2
    written = list(range(int(ops[dest_at][2:]), int(ops[dest_at][2:]) + pair_out)) if dest_at is not None else []
    reads: list[int] = []
    a_in_registers = len(ops) > 1 and re.fullmatch(r"R\d+", ops[1]) is not None
    for i, a in enumerate(ops):
        if i == dest_at:
            continue
        for kind, n in _DESCRIPTOR.findall(a):
            n = int(n)
            reads += range(n + 2, n + 4) if kind == "gdesc" and a_in_registers else \
                range(n, n + (4 if kind == "gdesc" else 2))
        rest = _DESCRIPTOR.sub("", a)
        for inner in re.findall(r"\[([^\]]*)\]", rest):
            reads += [int(n) for n in _UNIFORM_REGISTER.findall(inner)]
        width = 2 if ".WIDE" in op and i == len(ops) - 1 else wide
        for n in _UNIFORM_REGISTER.findall(re.sub(r"\[[^\]]*\]", "", rest)):
            reads += range(int(n), int(n) + width)
    return reads, written


def _control_flow(ins: list[tuple]) -> tuple[list[range], list[set[int]], set[int]]:
    """Basic blocks of one SASS function (instruction index ranges: leaders are the entry, branch
    and BSSY targets and what follows a branch or an exit), each block's predecessors, and the
    blocks reachable from the entry. An indirect branch (BRX: a warp-specialized kernel's dispatch
    to its partitions through a table) may reach every block nothing else reaches."""
    index = {a: i for i, (a, *_) in enumerate(ins)}
    leaders, succ_of = {0}, {}
    for i, (_, op, args, predicated) in enumerate(ins):
        base = op.split(".")[0]
        targets = [index[int(t, 16)] for t in re.findall(r"0x([0-9a-f]+)", args) if int(t, 16) in index] \
            if base in ("BRA", "JMP", "BSSY", "CALL") else []
        ends = base in ("BRA", "BRX", "JMP", "JMX", "EXIT", "RET", "BPT") and not predicated
        if base in ("BRA", "JMP", "EXIT", "RET", "BRX", "JMX") or targets:
            leaders.add(i + 1)
        leaders.update(targets)
        succ_of[i] = (targets if base != "BSSY" else []) + ([] if ends else [i + 1])
    starts = sorted(x for x in leaders if x < len(ins))
    blocks = [range(lo, starts[b + 1] if b + 1 < len(starts) else len(ins)) for b, lo in enumerate(starts)]
    block_of = {i: b for b, r in enumerate(blocks) for i in r}
    succs = [{block_of[j] for j in succ_of[r[-1]] if j in block_of} for r in blocks]
    preds: list[set[int]] = [set() for _ in blocks]
    for b, ss in enumerate(succs):
        for t in ss:
            preds[t].add(b)
    indirect = [b for b, r in enumerate(blocks) if ins[r[-1]][1].split(".")[0] in ("BRX", "JMX")]
    for t in [b for b in range(1, len(blocks)) if not preds[b]] if indirect else []:
        for b in indirect:
            succs[b].add(t)
            preds[t].add(b)
    reach, todo = {0}, [0]
    while todo:
        for t in succs[todo.pop()] - reach:
            reach.add(t)
            todo.append(t)
    return blocks, preds, reach


def undefined_uniform_reads(sass: str) -> list[str]:
    """Uniform registers a kernel's SASS reads where some path from the function's entry wrote
    none of them: 'address opcode URn' each (a forward must-be-written analysis over the basic
    blocks of _control_flow; a predicated write counts as a write, so this can miss, it does not
    prove). ptxas 12.8 (Triton 3.6's) emits such a read in the wgmma descriptor arithmetic of the
    fp8 prologue at 4 warps on 96 and 112 columns: the A operand's address from a register nothing
    wrote, the out-of-bounds shared-memory reads and illegal addresses seen on the H200. So every
    compile is checked for them. A copy is not a use: ptxas parks uniform registers in regular ones
    (MOV, IMAD.MOV.U32 R, RZ, RZ, UR) around a wgmma's descriptor set-up and moves them back with
    R2UR; a UMOV of an unwritten register leaves its destination unwritten."""
    bad = []
    for func in re.split(r"\n\s*Function : ", sass):
        ins = []
        for addr, text in _SASS_INSTRUCTION.findall(func):
            text = text.strip()
            pred = re.match(r"^@(!?U?P\w+)\s+", text)
            op, _, args = (text[pred.end():] if pred else text).partition(" ")
            ins.append((int(addr, 16), op, args.strip(), pred is not None and pred.group(1) not in ("PT", "UPT")))
        if not ins:
            continue
        blocks, preds, reach = _control_flow(ins)
        access = [_uniform_access(op, args) for _, op, args, _ in ins]

        def step(i: int, cur: set[int]) -> list[int]:
            """Instruction i applied to the written set `cur`; its reads of unwritten registers."""
            reads, written = access[i]
            missing = [n for n in dict.fromkeys(reads) if n not in cur]
            op, ops = ins[i][1], [a.strip() for a in ins[i][2].split(",")]
            if op == "UMOV":
                cur.update([] if missing else written)
                return []
            if op == "MOV" or (op.startswith("IMAD") and ops[1:3] == ["RZ", "RZ"]):
                return []
            cur.update(written)
            return missing

        def entry(b: int) -> set[int]:
            return set() if b == 0 else set.intersection(*(out[p] for p in preds[b] if p in reach))

        out = [set(range(256)) for _ in blocks]  # what is written at each block's end: none known yet
        changed = True
        while changed:
            changed = False
            for b in sorted(reach):
                cur = entry(b)
                for i in blocks[b]:
                    step(i, cur)
                if cur != out[b]:
                    out[b], changed = cur, True
        for b in sorted(reach):
            cur = entry(b)
            bad += [f"{ins[i][0]:04x} {ins[i][1]} UR{n}" for i in blocks[b] for n in step(i, cur)]
    return bad
