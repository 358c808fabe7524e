#!/usr/bin/env python3
"""prefill_cluster_protocol_model.py [--runs N] [--seed S] [--mutation NAME]: the synchronisation
of prefill-h128-cluster-gather.patch, run under random interleavings.

Two CTAs of a cluster, each with a producer and two math warpgroups, walk the same items (the
token's two head groups) as the patched kernel does, with its barriers (arrival counts, phases,
transaction bytes, remote arrivals) and its asynchronous copies (cp.async landing, the bulk copy to
the peer, the TMA store of O) as events that happen at random later times. Each shared-memory
region of a tile buffer carries a tag (which tile's K rows, which tile's P, which item's O). The
model checks that:
  - every read sees what it should (S: the tile's K rows in both halves; a P·V: the tile's V half
    and, for the other warpgroup's tile, its P; the bulk copy: this CTA's rows; the O store: the
    item's O), and nothing writes a region while a read of it is in flight (a wgmma between its
    issue and its wait, a bulk copy or a TMA store between start and completion);
  - every run ends (no deadlock), with every barrier's phases consistent.
--mutation breaks one rule of the protocol, to show the model catches it (each should fail).
Not a proof: one schedule per run, items and tile counts drawn at random.
"""
import argparse
import random
import sys

HALF0, HALF1 = 4 * 4096, 5 * 4096  # bytes of a CTA's half-rows per tile half (d 576)
MUTATIONS = ("no_copied_wait", "no_remote_release", "store_after_empty_wait", "no_expect_half1",
             "release_before_pv_done", "odd_grid_pairing")


class Violation(Exception):
    pass


class Barrier:
    """An mbarrier: `count` arrivals and zero pending transaction bytes complete a phase."""

    def __init__(self, name, count):
        self.name, self.count, self.pending, self.tx, self.completed = name, count, count, 0, 0

    def arrive(self, n=1, tx=0):
        self.tx += tx
        self.pending -= n
        if self.pending < 0:
            raise Violation(f"{self.name}: more arrivals than its count in one phase")
        self._maybe_complete()

    def complete_tx(self, nbytes):
        self.tx -= nbytes
        self._maybe_complete()

    def _maybe_complete(self):
        if self.pending == 0 and self.tx == 0:
            self.completed += 1
            self.pending = self.count

    def passed(self, parity):  # try_wait.parity
        return self.completed % 2 != parity


class Cta:
    def __init__(self, rank, mutation):
        self.rank = rank
        self.k_full = [[Barrier(f"cta{rank}.k_full[{b}][{h}]", 256 if h == 0 else
                            (128 if mutation == "no_expect_half1" else 129)) for h in (0, 1)] for b in (0, 1)]
        self.k_empty = [Barrier(f"cta{rank}.k_empty[{b}]", 256 + 8) for b in (0, 1)]
        self.o_staged = [Barrier(f"cta{rank}.o_staged[{b}]", 256) for b in (0, 1)]
        self.copied = [Barrier(f"cta{rank}.copied[{b}]", 1) for b in (0, 1)]
        self.p_ready = [Barrier(f"cta{rank}.p_ready[{b}]", 128) for b in (0, 1)]
        self.l_exchange = 0  # named barrier of the two math WGs at an item's end: arrivals so far
        # Regions of buffer b: ("nope", r, h) (rank r's rows, value half h), ("rope", r).
        self.tag = {(b, reg): None for b in (0, 1) for reg in regions()}
        self.version = {key: 0 for key in self.tag}
        self.readers = {key: 0 for key in self.tag}

    def write(self, b, reg, tag):
        if self.readers[(b, reg)]:
            raise Violation(f"cta{self.rank} buffer {b} {reg}: written ({tag}) while a read is in flight")
        self.tag[(b, reg)] = tag
        self.version[(b, reg)] += 1

    def start_read(self, b, regs, want, what):
        for reg in regs:
            got = self.tag[(b, reg)]
            if got != want(reg):
                raise Violation(f"cta{self.rank} {what}: buffer {b} {reg} holds {got}, wants {want(reg)}")
            self.readers[(b, reg)] += 1
        return [(b, reg, self.version[(b, reg)]) for reg in regs]

    def end_read(self, token, what):
        for b, reg, v in token:
            self.readers[(b, reg)] -= 1
            if self.version[(b, reg)] != v:
                raise Violation(f"cta{self.rank} {what}: buffer {b} {reg} changed during the read")


def regions():
    return [("nope", r, h) for r in (0, 1) for h in (0, 1)] + [("rope", r) for r in (0, 1)]


def producer(cta, peer, items, events, mutation):
    """The patched producer: per tile g, buffer g % 2."""
    c = cta.rank
    g = 0
    staged = [None, None]
    o_parity = [0, 0]

    def store_o(b, item):
        yield lambda: cta.o_staged[b].passed(o_parity[b])
        o_parity[b] ^= 1
        token = cta.start_read(b, [("nope", r, h) for r in (0, 1) for h in (0, 1)], lambda reg: ("O", item),
                               "O store")
        done = []
        events.append(lambda: (cta.end_read(token, "O store"), done.append(1)))
        yield lambda: bool(done)  # bulk_wait_read

    for item, n in items:
        for t in range(n):
            b = g & 1
            if staged[b] is not None and mutation != "store_after_empty_wait":
                yield from store_o(b, staged[b])
                cta.k_empty[b].arrive(256)
                peer.k_empty[b].arrive(8)
                staged[b] = None
            if g >= 2:
                parity = ((g >> 1) - 1) & 1
                yield lambda b=b, parity=parity: cta.k_empty[b].passed(parity)
            if staged[b] is not None:  # the mutation: store only after the release
                yield from store_o(b, staged[b])
                cta.k_empty[b].arrive(256)
                peer.k_empty[b].arrive(8)
                staged[b] = None
            cta.k_full[b][0].arrive(128, tx=HALF0)  # key_valid flags; one thread expects the peer's half 0
            landed = []

            def land(h, b=b, token=item // 2, t=t, landed=landed):
                regs = [("nope", c, 0)] if h == 0 else [("nope", c, 1), ("rope", c)]
                for reg in regs:
                    cta.write(b, reg, ("K", token, t))
                cta.k_full[b][h].arrive(128)
                landed.append(h)

            events.append(lambda land=land: land(0))
            events.append(lambda land=land: land(1))
            if mutation != "no_expect_half1":
                cta.k_full[b][1].arrive(1, tx=HALF1)
            yield lambda landed=landed: len(landed) == 2  # cp.async.wait_group 0, then the barrier of 128

            for h in (0, 1):  # the bulk copies, by half (their reads, then their writes into the peer)
                regs = [("nope", c, 0)] if h == 0 else [("nope", c, 1), ("rope", c)]
                read = cta.start_read(b, regs, lambda reg, tag=("K", item // 2, t): tag, "bulk copy source")

                def deliver(h=h, b=b, tag=("K", item // 2, t), regs=regs, read=read):
                    cta.end_read(read, "bulk copy source")
                    for reg in regs:
                        peer.write(b, reg, tag)
                    peer.k_full[b][h].complete_tx(HALF0 if h == 0 else HALF1)

                events.append(deliver)
            g += 1
        if n > 0:
            staged[(g - 1) & 1] = item
    for b in (0, 1):
        if staged[b] is not None:
            yield from store_o(b, staged[b])


def math_wg(cta, peer, w, items, mutation):
    """The patched math warpgroup w: owner of tiles t ≡ w (mod 2) of each item."""
    g = 0
    remote_phase = 0
    inflight = []  # read tokens of issued wgmma groups, in order
    k = 0

    def wait_all():
        while inflight:
            cta.end_read(inflight.pop(0), "wgmma")

    def release(b):
        cta.k_empty[b].arrive(128)
        if mutation != "no_remote_release":
            peer.k_empty[b].arrive(4)

    for item, n in items:
        def buf(t):
            return (g + t) & 1

        def own_tile(t):
            b = buf(t)
            phase = ((g + t) >> 1) & 1
            yield lambda: cta.k_full[b][0].passed(phase) and cta.k_full[b][1].passed(phase)
            peer.copied[b].arrive(1)
            read = cta.start_read(b, regions(), lambda reg: ("K", item // 2, t), "S")
            cta.end_read(read, "S")  # wgmma_wait<0> right after (S done)
            yield lambda: True  # the softmax
            if mutation != "no_copied_wait":
                yield lambda: cta.copied[b].passed(phase)
            for r in (0, 1):
                cta.write(b, ("rope", r), ("P", item // 2, t))  # P in d 576's rope block (owner only)
            cta.p_ready[t & 1].arrive(128)
            inflight.append(cta.start_read(b, [("nope", r, w) for r in (0, 1)], lambda reg: ("K", item // 2, t),
                                           "own P·V"))

        def accumulate_remote(t):
            nonlocal remote_phase
            b = buf(t)
            yield lambda rp=remote_phase: cta.p_ready[t & 1].passed(rp)
            remote_phase ^= 1
            want = lambda reg: ("P", item // 2, t) if reg[0] == "rope" else ("K", item // 2, t)
            inflight.append(cta.start_read(b, [("nope", r, w) for r in (0, 1)] + [("rope", r) for r in (0, 1)],
                                           want, "remote P·V"))

        t = w
        if w == 0 and n > 0:
            yield from own_tile(0)
            t = 2
        while t < n:
            wait_all()
            if t >= 2:
                release(buf(t))
            yield from accumulate_remote(t - 1)
            if mutation == "release_before_pv_done":
                release(buf(t - 1))
                yield lambda: True
                wait_all()
            else:
                yield lambda: True
                wait_all()
                release(buf(t - 1))
            yield from own_tile(t)
            t += 2
        if t == n and t >= 1:
            wait_all()
            if t >= 2:
                release(buf(t))
            yield from accumulate_remote(t - 1)
        yield lambda: True
        wait_all()
        # the row-sum exchange (a named barrier of both WGs), then O staged in the last tile's buffer
        cta.l_exchange += 1
        target = 2 * (k + 1)
        yield lambda: cta.l_exchange >= target
        if n >= 1:
            stage = buf(n - 1)
            for r in (0, 1):
                cta.write(stage, ("nope", r, w), ("O", item))
            cta.o_staged[stage].arrive(128)
        g += n
        k += 1


def run(seed, mutation, verbose=False):
    rng = random.Random(seed)
    grid_pairs = rng.randint(1, 3)
    s_q = rng.randint(1, 7)
    lengths = [rng.choice([0, 1, 2, 3, 4, 5, 8]) for _ in range(s_q)]
    grid = 2 * grid_pairs + (1 if mutation == "odd_grid_pairing" else 0)
    items_of = {cta: [] for cta in range(grid)}
    for item in range(2 * s_q):
        items_of[item % grid].append((item, lengths[item // 2]))
    events = []
    agents = []
    for pair in range(grid_pairs):
        ctas = [Cta(0, mutation), Cta(1, mutation)]
        for r in (0, 1):
            cta, peer = ctas[r], ctas[1 - r]
            items = items_of[2 * pair + r]
            agents.append(producer(cta, peer, items, events, mutation))
            agents.extend(math_wg(cta, peer, w, items, mutation) for w in (0, 1))
    conditions = [None] * len(agents)
    live = set(range(len(agents)))
    for i in list(live):  # start every agent to its first wait
        try:
            conditions[i] = next(agents[i])
        except StopIteration:
            live.discard(i)
    steps = 0
    while live or events:
        ready = [i for i in live if conditions[i]()]
        choices = [("agent", i) for i in ready] + [("event", j) for j in range(len(events))]
        if not choices:
            raise Violation(f"deadlock: {len(live)} agents waiting, no event pending")
        kind, i = rng.choice(choices)
        if kind == "event":
            events.pop(i)()
        else:
            try:
                conditions[i] = agents[i].send(None)
            except StopIteration:
                live.discard(i)
        steps += 1
        if steps > 200000:
            raise Violation("no progress in 200000 steps")
    return steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--mutation", choices=MUTATIONS)
    ap.add_argument("--all-mutations", action="store_true", help="check that each mutation is caught")
    args = ap.parse_args()
    if args.all_mutations:
        ok = True
        for m in MUTATIONS:
            caught = None
            for s in range(args.runs):
                try:
                    run(args.seed * 100003 + s, m)
                except Violation as e:
                    caught = (s, e)
                    break
            print(f"{m:24s} {'caught' if caught else 'NOT caught'}" + (f" (run {caught[0]}: {caught[1]})" if caught else ""))
            ok &= caught is not None
        sys.exit(0 if ok else 1)
    for s in range(args.runs):
        try:
            run(args.seed * 100003 + s, args.mutation)
        except Violation as e:
            print(f"run {s}: {e}")
            sys.exit(1)
    print(f"{args.runs} runs, no violation" + (f" (mutation {args.mutation})" if args.mutation else ""))


if __name__ == "__main__":
    main()
