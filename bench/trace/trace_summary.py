# Summarises a DSV4_PREFILL_TRACE dump (CTA 0, clock64 per tile event; see bench/trace/add_trace.py).
import sys, statistics as st
rows = [list(map(int, l.split())) for l in open(sys.argv[1])]
rows = [r for r in rows if r[4] or r[11] or r[1]]
base = min(v for r in rows for v in r if v)
names = {
 'prod empty wait (1-0)': (0, 1), 'prod issue half0 (2-1)': (1, 2), 'prod issue half1 (3-2)': (2, 3),
 'math kfull0 wait (5-4)': (4, 5), 'math kfull1 wait (6-5)': (5, 6), 'S tail after issue (7-6)': (6, 7),
 'softmax+publish (8-7)': (7, 8), 'own PV issue (9-8)': (8, 9), 'own PV done seen (10-9)': (9, 10),
 'remote p_ready wait (12-11)': (11, 12), 'remote PV done (14-13)': (13, 14),
 'half0 issued -> seen (5-2)': (2, 5), 'empty end -> kfull1 seen (6-1)': (1, 6),
}
def med(a, b, lo=4):
    xs = [r[b] - r[a] for r in rows[lo:] if r[a] and r[b]]
    return (st.median(xs), min(xs), max(xs), len(xs)) if xs else None
for k, (a, b) in names.items():
    print(f"{k:34s}", med(a, b))
s5 = [r[5] for r in rows if r[5]]
per = [b - a for a, b in zip(s5[4:], s5[5:])]
print("S-start period: median", st.median(per), "mean", sum(per) / len(per))
free = []
for g in range(len(rows) - 2):
    r, r2 = rows[g], rows[g + 2]
    if r[10] and r[14] and r2[1]:
        free.append((max(r[10], r[14]) - min(r[10], r[14]), r2[1] - max(r[10], r[14])))
print("own/remote PV done spread, free->prod wake:", st.median([f[0] for f in free]) if free else None,
      st.median([f[1] for f in free]) if free else None)
print("first 40 tiles (cycles from start): g: e0 e1 i0 i1 | w4 k5 k6 s7 p8 v9 d10 | r11 r12 v13 d14")
for g, r in enumerate(rows[:40]):
    f = lambda i: (r[i] - base) if r[i] else -1
    print(g, [f(i) for i in range(4)], [f(i) for i in range(4, 11)], [f(i) for i in range(11, 15)], f(15))
print("items: epilogue start | +barrier | +factor | +stores | +lse | next item marker (cycles since previous column)")
allrows = [list(map(int, l.split())) for l in open(sys.argv[1])]
for k in range(240, 256):
    r = allrows[k]
    if r[0]:
        cols = [r[0], r[4], r[1], r[2], r[3], r[5]]
        print(k - 240, r[0] - base, [b - a if a and b else None for a, b in zip(cols, cols[1:])])
