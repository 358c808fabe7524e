#!/usr/bin/env python3
"""sass_stats.py BASE_DIR NEW_DIR: per kernel of the <name>.sass / <name>.ptxas.txt pairs that
kernel_sass_diff.sh writes, the base's and the new build's ptxas resources, instruction counts,
whether the instruction streams are identical (branch targets aside), the counts of the
instructions these kernels live on, and the innermost loops of 100+ instructions (the hot loops:
a tile loop, a gather loop) with their length and the same counts. Per hot loop it also names the
global loads whose value is read before the loop's back edge (early_reads): such a read waits out
the load's latency inside the iteration that issued it, where a refill meant for the next tile
should be read only after the wrap (docs/notes/decode.md, "The scale decode and the predicated
loads, by SASS and by the clock")."""
import collections
import glob
import os
import re
import sys

KEYS = ["HGMMA", "LDS", "STS", "BAR", "SYNCS", "LDG", "STG", "LDGSTS", "UTMALDG", "UTMASTG", "STL", "LDL",
        "SHFL", "MUFU"]


def parse_sass(path):
    funcs, cur = {}, None
    for line in open(path):
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            cur = m.group(1)
            funcs[cur] = []
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m and cur:
            funcs[cur].append((int(m.group(1), 16), m.group(2).strip()))
    return funcs


def parse_ptxas(path):
    res, cur = {}, None
    for line in open(path):
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            cur = m.group(1)
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and cur:
            res.setdefault(cur, {})["stack/spill st/ld"] = "/".join(m.groups())
        m = re.search(r"Used (\d+) registers", line)
        if m and cur:
            res.setdefault(cur, {})["regs"] = m.group(1)
    return res


def unpredicated(ins):
    return re.sub(r"^@!?U?P\w+\s+", "", ins)


def opcode(ins):
    return unpredicated(ins).split()[0].split(".")[0]


def normalised(ins):
    return re.sub(r"0x[0-9a-f]+", "ADDR", ins) if re.search(r"\b(BRA|BSSY|CALL|JMP|BRX)\b", ins) else ins


def counts(body):
    c = collections.Counter(opcode(i) for _, i in body)
    return " ".join(f"{k} {c[k]}" for k in KEYS if c[k])


def hot_loops(code):
    index = {a: n for n, (a, _) in enumerate(code)}
    loops = []
    for n, (a, ins) in enumerate(code):
        m = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", ins)
        if m and int(m.group(1), 16) <= a and int(m.group(1), 16) in index and n - index[int(m.group(1), 16)] >= 100:
            loops.append((index[int(m.group(1), 16)], n))
    inner = [l for l in loops if not any(o != l and l[0] <= o[0] and o[1] <= l[1] for o in loops)]
    return [code[b:e + 1] for b, e in inner]


def _registers(operand, width):
    """The registers an operand names: a plain Rn is a vector of `width` registers from Rn; inside
    an address ([...]) Rn is one register and Rn.64 a pair."""
    regs = set()
    for m in re.finditer(r"(\[[^\]]*)?\bR(\d+)(\.64)?", operand):
        n = int(m.group(2))
        count = 2 if m.group(3) else 1 if m.group(1) is not None else width
        regs.update(f"R{n + k}" for k in range(count))
    return regs


def _width(ins):
    """Registers a vector operand spans, from the opcode's .128 / .64 suffix."""
    op = ins.split()[0]
    return 4 if ".128" in op else 2 if ".64" in op else 1


def _operand_widths(ins, count):
    """Registers each of an instruction's `count` operands spans, destination first. A .WIDE
    instruction (IMAD.WIDE.U32 R22, R3, 0x4, R22) writes a pair and adds a pair; its other
    sources are single registers."""
    if ".WIDE" in ins.split()[0]:
        return [2] + [1] * (count - 2) + [2] if count > 1 else [2]
    return [_width(ins)] * count


def early_reads(loop):
    """(index, distance) of each LDG in `loop` whose value is read within the same iteration,
    `distance` instructions after it. A register that a later instruction overwrites before any
    read no longer counts; reads after the back edge are not listed. mbarrier operations (SYNCS)
    are not counted as reads: their register operand is a phase or a count, set on paths that a
    straight-line walk of the loop may not pass (their retry branches leave the loop's range)."""
    body = [unpredicated(ins) for _, ins in loop]
    found = []
    for n, ins in enumerate(body):
        if not ins.startswith("LDG"):
            continue
        live = _registers(ins.split(None, 1)[1].split(",")[0], _width(ins))
        for d, later in enumerate(body[n + 1:], start=1):
            parts = later.split(None, 1)
            if len(parts) < 2:
                continue
            ops = parts[1].split(",")
            if parts[0].startswith("SYNCS"):
                continue
            stores = parts[0].startswith(("ST", "RED", "ATOM"))
            widths = _operand_widths(later, len(ops))
            read = zip(ops, widths) if stores else zip(ops[1:], widths[1:])
            if any(_registers(o, w) & live for o, w in read):
                found.append((n, d))
                break
            if not stores:
                live -= _registers(ops[0], widths[0])
                if not live:
                    break
    return found


def main(base_dir, new_dir):
    all_same = True
    for base_sass in sorted(glob.glob(os.path.join(base_dir, "*.sass"))):
        name = os.path.basename(base_sass)[:-5]
        fa, fb = parse_sass(base_sass), parse_sass(os.path.join(new_dir, name + ".sass"))
        pa = parse_ptxas(os.path.join(base_dir, name + ".ptxas.txt"))
        pb = parse_ptxas(os.path.join(new_dir, name + ".ptxas.txt"))
        for fn in sorted(fa):
            a, b = fa[fn], fb.get(fn, [])
            same = [normalised(i) for _, i in a] == [normalised(i) for _, i in b]
            all_same &= same
            print(f"## {fn}")
            print(f"  ptxas   base {pa.get(fn)}  new {pb.get(fn)}")
            print(f"  instructions base {len(a)}  new {len(b)}  identical: {same}")
            print(f"  base: {counts(a)}\n  new:  {counts(b)}")
            la, lb = hot_loops(a), hot_loops(b)
            for n in range(max(len(la), len(lb))):
                desc = [f"{len(l[n])} instr, {counts(l[n])}" if n < len(l) else "-" for l in (la, lb)]
                print(f"  hot loop {n}: base {desc[0]}\n              new  {desc[1]}")
                early = [", ".join(f"+{d}" for _, d in early_reads(l[n])) or "none" if n < len(l) else "-"
                         for l in (la, lb)]
                print(f"    loads read in their own iteration: base {early[0]}; new {early[1]}")
    print("all kernels identical" if all_same else "some kernels differ")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
