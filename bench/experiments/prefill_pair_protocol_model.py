"""A model of the prefill pair schedule's synchronisation (bench/experiments/prefill-pair-schedule.patch),
transcribed from the patched math.cuh / producer.cuh, run under random interleavings.

Roles: producer (one actor = its 128 threads), WG0, WG1. mbarriers with exact parity-wait semantics.
Async operations (cp.async gathers, wgmma reads, TMA O stores) are modelled as read/write intervals on
shared-memory regions; checks: no write overlaps an open read or write of the same region, each read sees
the version it expects, each arrival lands in the phase it means, each passing wait passes for the phase it
means, no deadlock.
"""
import random
import sys


class Bar:
    def __init__(self, name, count):
        self.name, self.count, self.pending, self.phase = name, count, 0, 0  # phase: current (incomplete)

    def arrive(self, meant):
        assert meant == self.phase, f"{self.name}: arrival meant for phase {meant}, barrier in phase {self.phase}"
        self.pending += 1
        if self.pending == self.count:
            self.pending = 0
            self.phase += 1

    def can_pass(self, parity):
        return (self.phase & 1) != parity


class World:
    def __init__(self, d576):
        self.d576 = d576
        self.bars = {}
        for b in range(2):
            for h in range(2):
                self.bars[("full", b, h)] = Bar(f"full{b}{h}", 1)
                self.bars[("empty", b, h)] = Bar(f"empty{b}{h}", 1)
            self.bars[("max", b)] = Bar(f"max_ready{b}", 1)
            self.bars[("p", b)] = Bar(f"p_ready{b}", 1)
        self.bars["q_full"] = Bar("q_full", 1)
        self.bars["q_empty"] = Bar("q_empty", 2)
        self.version = {}  # region -> version tag
        self.open_reads = {}  # region -> set of tags
        self.open_writes = {}  # region -> tag
        self.named = {}  # named barrier id -> arrivals in current generation

    def regions_of_quarter(self, b, h):
        r = [("q", b, h)]
        if self.d576 and b == 0 and h == 1:
            r.append("rope0")  # P0 lives in buffer 0's rope block at d 576
        return r

    def p_region(self, w):
        if self.d576:
            return "rope0" if w == 0 else "pbuf0"
        return f"pbuf{w}"

    def begin_write(self, region, tag):
        assert not self.open_reads.get(region), f"write {tag} to {region} while read by {self.open_reads[region]}"
        assert region not in self.open_writes, f"write {tag} to {region} while written by {self.open_writes[region]}"
        self.open_writes[region] = tag

    def end_write(self, region, tag):
        assert self.open_writes.get(region) == tag
        del self.open_writes[region]
        self.version[region] = tag

    def begin_read(self, region, want, who):
        assert region not in self.open_writes, f"{who} reads {region} while written by {self.open_writes[region]}"
        got = self.version.get(region)
        assert got == want, f"{who} reads {region}: wants {want}, holds {got}"
        self.open_reads.setdefault(region, set()).add(who)

    def end_read(self, region, who):
        self.open_reads[region].remove(who)


def num_pairs(n):
    return (n + 1) // 2


RELEASE_ORDER = [(0, 0), (1, 1), (0, 1), (1, 0)]
BUFFER1_FIRST = [(1, 1), (1, 0), (0, 0), (0, 1)]
BUFFER0_FIRST = [(0, 0), (0, 1), (1, 1), (1, 0)]


def producer(w, items):
    uses = [0, 0]
    staged = [None, None]
    for k, n in enumerate(items):
        # load_q (tid 0): wait q_empty of item k-1, then TMA Q (modelled as instantaneous write + arrive)
        if k >= 1:
            yield ("wait", "q_empty", (k - 1) & 1, k - 1)
        w.begin_write("Q", ("Q", k))
        w.end_write("Q", ("Q", k))
        yield ("arrive", "q_full", k)
        for j in range(num_pairs(n)):
            whole = 2 * j + 1 < n

            def wait_free(b, h, use):
                if use >= 1:
                    yield ("wait", ("empty", b, h), (use - 1) & 1, use - 1)

            def fill(b, h, use):  # wait for the quarter (and a staged O's store), gather it, announce it
                yield from wait_free(b, h, use)
                if staged[b] is not None:
                    yield from wait_free(b, 1 - h, use)
                    store_o(w, b, staged[b])
                    staged[b] = None
                for reg in w.regions_of_quarter(b, h):
                    w.begin_write(reg, ("tile", b, use, h))
                    w.end_write(reg, ("tile", b, use, h))
                yield ("arrive", ("full", b, h), use)

            if staged[0] is not None and staged[1] is None:
                order = BUFFER1_FIRST
            elif staged[1] is not None:
                order = BUFFER0_FIRST
            else:
                order = RELEASE_ORDER
            for b, h in order:
                if b == 1 and not whole:
                    continue
                yield from fill(b, h, uses[b] + j)
        if n > 0:
            staged[(n - 1) & 1] = k
        uses[0] += (n + 1) // 2
        uses[1] += n // 2
    for b in range(2):
        if staged[b] is not None:
            yield ("wait", ("empty", b, 0), (uses[b] - 1) & 1, uses[b] - 1)
            yield ("wait", ("empty", b, 1), (uses[b] - 1) & 1, uses[b] - 1)
            store_o(w, b, staged[b])


def store_o(w, b, item):  # the TMA store of an item's O staged in buffer b (both quarters)
    for h in range(2):
        w.begin_read(("q", b, h), ("O", item, h), "producer-store")
        w.end_read(("q", b, h), "producer-store")


class Wg:
    """One math warpgroup: its async wgmma groups (list of lists of regions read), and the events."""

    def __init__(self, w, W):
        self.w, self.W = w, W
        self.groups = []  # wgmma groups in flight, oldest first: (regions, who)
        self.uses = [0, 0]
        self.pairs = 0
        self.whole_pairs = 0

    def wait_groups(self, n_in_flight):
        while len(self.groups) > n_in_flight:
            regions, who = self.groups.pop(0)
            for reg in regions:
                self.w.end_read(reg, who)

    def issue(self, reads):
        """A wgmma group: reads (region, wanted version) begin now and end at the wait that retires it."""
        who = f"wg{self.W}-g{random.random()}"
        for reg, want in reads:
            self.w.begin_read(reg, want, who)
        self.groups.append(([reg for reg, _ in reads], who))


def wg_program(w, W, items):
    g = Wg(w, W)
    for k, n in enumerate(items):
        yield ("wait", "q_full", k & 1, k)
        own_tiles = (n + 1) // 2 if W == 0 else n // 2
        if own_tiles == 0:
            yield ("arrive", "q_empty", k)
        P = num_pairs(n)

        def own_phase(j):
            return g.uses[W] + j

        def issue_s_first(j):
            u = own_phase(j)
            yield ("wait", ("full", W, W), u & 1, u)
            regs = [(r, ("tile", W, u, W)) for r in w.regions_of_quarter(W, W)]
            g.issue([("Q", ("Q", k))] + regs)

        def issue_s_second(j):
            u = own_phase(j)
            yield ("wait", ("full", W, 1 - W), u & 1, u)
            regs = [(r, ("tile", W, u, 1 - W)) for r in w.regions_of_quarter(W, 1 - W)]
            g.issue([("Q", ("Q", k))] + regs)

        def write_p(j):
            reg = w.p_region(W)
            w.begin_write(reg, ("P", W, k, j))
            w.end_write(reg, ("P", W, k, j))

        if W == 0:
            if P > 0:
                yield from issue_s_first(0)
                yield from issue_s_second(0)
            for j in range(P):
                whole = 2 * j + 1 < n
                last = j + 1 == P
                u0 = g.uses[0] + j
                u1 = g.uses[1] + j
                g.wait_groups(0)
                if last:
                    yield ("arrive", "q_empty", k)
                # publish m0
                w.begin_write("pm0", ("m0", k, j)); w.end_write("pm0", ("m0", k, j))
                yield ("arrive", ("max", 0), g.pairs)
                # own P·V: P from registers, V half 0 of buffer 0
                g.issue([(("q", 0, 0), ("tile", 0, u0, 0))])
                g.wait_groups(0)
                if not (last and not whole):
                    yield ("arrive", ("empty", 0, 0), u0)
                if whole:
                    yield ("wait", ("max", 1), g.whole_pairs & 1, g.whole_pairs)
                    w.begin_read("pm1", ("m1", k, j), "wg0"); w.end_read("pm1", "wg0")
                    w.begin_read("pseen", ("seen", k, j), "wg0"); w.end_read("pseen", "wg0")
                write_p(j)
                yield ("arrive", ("p", 0), g.pairs)
                if whole:
                    yield ("wait", ("p", 1), g.whole_pairs & 1, g.whole_pairs)
                    g.issue([(w.p_region(1), ("P", 1, k, j)), (("q", 1, 0), ("tile", 1, u1, 0))])
                    if not last:
                        yield from issue_s_first(j + 1)
                        g.wait_groups(1)
                        yield ("arrive", ("empty", 1, 0), u1)
                        yield from issue_s_second(j + 1)
                    else:
                        g.wait_groups(0)  # (1, 0) held back for the staged O
                    g.whole_pairs += 1
                g.pairs += 1
            g.wait_groups(0)
        else:
            for j in range(P):
                whole = 2 * j + 1 < n
                last = j + 1 == P
                u0 = g.uses[0] + j
                u1 = g.uses[1] + j
                if whole:
                    yield from issue_s_first(j)
                    yield from issue_s_second(j)
                    g.wait_groups(0)
                    if 2 * j + 3 >= n:
                        yield ("arrive", "q_empty", k)
                yield ("wait", ("max", 0), g.pairs & 1, g.pairs)
                w.begin_read("pm0", ("m0", k, j), "wg1"); w.end_read("pm0", "wg1")
                if whole:
                    w.begin_write("pm1", ("m1", k, j)); w.end_write("pm1", ("m1", k, j))
                    w.begin_write("pseen", ("seen", k, j)); w.end_write("pseen", ("seen", k, j))
                    yield ("arrive", ("max", 1), g.whole_pairs)
                    write_p(j)
                    yield ("arrive", ("p", 1), g.whole_pairs)
                    g.issue([(("q", 1, 1), ("tile", 1, u1, 1))])
                yield ("wait", ("p", 0), g.pairs & 1, g.pairs)
                regs = [(w.p_region(0), ("P", 0, k, j))]
                regs += [(r, ("tile", 0, u0, 1)) for r in w.regions_of_quarter(0, 1) if r != "rope0"]
                g.issue(regs)
                if whole:
                    g.wait_groups(1)
                    if not last:
                        yield ("arrive", ("empty", 1, 1), u1)
                    g.whole_pairs += 1
                g.wait_groups(0)
                if not (last and not whole):
                    yield ("arrive", ("empty", 0, 1), u0)
                g.pairs += 1
        g.uses[0] += (n + 1) // 2
        g.uses[1] += n // 2
        # epilogue: row-sum exchange (named barrier, both WGs), write_o, stats
        w.begin_write(("rowsum", k & 1, W), ("l", k)); w.end_write(("rowsum", k & 1, W), ("l", k))
        yield ("named", "lx", k)
        for other in range(2):
            w.begin_read(("rowsum", k & 1, other), ("l", k), f"wg{W}"); w.end_read(("rowsum", k & 1, other), f"wg{W}")
        if n >= 1:
            b = (n - 1) & 1
            w.begin_write(("q", b, W), ("O", k, W)); w.end_write(("q", b, W), ("O", k, W))
            yield ("arrive", ("empty", b, W), g.uses[b] - 1)


def run(items, d576, seed):
    random.seed(seed)
    w = World(d576)
    roles = {"prod": producer(w, items), "wg0": wg_program(w, 0, items), "wg1": wg_program(w, 1, items)}
    pending = {}  # role -> op it is blocked on
    named_gen = {}
    done = set()
    steps = 0
    while len(done) < 3:
        steps += 1
        assert steps < 100000
        runnable = []
        for name, gen in roles.items():
            if name in done:
                continue
            op = pending.get(name)
            if op is None:
                runnable.append(name)
                continue
            if op[0] == "wait":
                bar = w.bars[op[1]]
                if bar.can_pass(op[2]):
                    runnable.append(name)
            elif op[0] == "named":
                key = (op[1], op[2])
                if named_gen.get(key, 0) >= 2:
                    runnable.append(name)
        if not runnable:
            raise AssertionError(f"deadlock: {pending}, bars: " +
                                 ", ".join(f"{b.name}@{b.phase}+{b.pending}" for b in w.bars.values()))
        name = random.choice(runnable)
        op = pending.pop(name, None)
        if op is not None and op[0] == "wait":
            bar = w.bars[op[1]]
            assert bar.phase == op[3] + 1, f"{name} passes {bar.name} meaning phase {op[3]}, barrier at {bar.phase}"
        try:
            nxt = next(roles[name])
        except StopIteration:
            done.add(name)
            continue
        if nxt[0] == "arrive":
            w.bars[nxt[1]].arrive(nxt[2])
        elif nxt[0] == "wait":
            pending[name] = nxt
        elif nxt[0] == "named":
            key = (nxt[1], nxt[2])
            named_gen[key] = named_gen.get(key, 0) + 1
            pending[name] = nxt
    return steps


if __name__ == "__main__":
    cases = [[0], [1], [2], [3], [4], [5], [1, 1], [3, 2], [2, 3, 0, 1, 4], [0, 0, 3], [5, 0, 2, 1, 1, 3, 4],
             [1, 2, 3, 4, 5, 6, 7], [7, 7, 7], [6, 1, 6, 1]]
    rng = random.Random(1)
    for _ in range(40):
        cases.append([rng.randint(0, 7) for _ in range(rng.randint(1, 8))])
    bad = 0
    for items in cases:
        for d576 in (False, True):
            for seed in range(150):
                try:
                    run(items, d576, seed)
                except AssertionError as e:
                    print(f"items {items} d576 {d576} seed {seed}: {e}")
                    bad += 1
                    break
    print("violations:", bad, "of", len(cases) * 2, "configurations")
    sys.exit(1 if bad else 0)
