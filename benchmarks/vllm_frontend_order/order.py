"""Per burst of a run.sh record (the first, a cold start, left out), in ms from the burst's
first send: the first request's hand-over to the engine core (AsyncLLM.add_request's start),
the hand-overs' spacing after it, the last hand-over (the intake's end), when the first
request's first output reached the output processor and the client, a request's share of the
intake, and the hand-over's share of it (the spacing over that).

    .venv/bin/python benchmarks/vllm_frontend_order/order.py /tmp/vfo/TAG
"""

import collections
import glob
import json
import statistics as st
import sys

D = sys.argv[1]
with open(f"{D}/client.json") as f:
    cl = {r["i"]: r for r in json.load(f)}
evs = []
for name in glob.glob(f"{D}/ev-*.jsonl"):
    with open(name) as f:
        evs += [json.loads(line) for line in f]
evs.sort(key=lambda e: e[0])
idx = {e[2]: e[3] for e in evs if e[1] == "app"}
per: dict[int, dict[str, float]] = collections.defaultdict(dict)
for e in evs:
    if e[1] in ("app", "body", "create", "add0", "zmq0", "zmq1", "send1") and e[2] in idx:
        per[idx[e[2]]].setdefault(e[1], e[0])
    if e[1] == "proc":
        for k in e[3]:
            if k in idx:
                per[idx[k]].setdefault("proc", e[0])
size = max(1, sum(1 for i in cl if cl[i]["sent"] - min(c["sent"] for c in cl.values()) < 0.005))
bursts = collections.defaultdict(list)
for i in cl:
    bursts[i // size].append(i)
print("burst  first  spacing  intake_end  first_proc  first_out  per_request  handover_share")
rows = []
for k in sorted(bursts)[1:]:
    ids = bursts[k]
    t0 = min(cl[i]["sent"] for i in ids)
    order = sorted(ids, key=lambda i: per[i]["add0"])
    a = [1e3 * (per[i]["add0"] - t0) for i in order]
    end = max(1e3 * (per[i]["zmq1"] - t0) for i in order)
    spacing = (a[-1] - a[1]) / (len(a) - 2)
    proc = 1e3 * (per[order[0]].get("proc", t0) - t0)
    out = 1e3 * (cl[order[0]]["first"] - t0)
    each = end / len(ids)
    rows.append((spacing, each))
    print(f"{k:5d} {a[0]:6.1f} {spacing:8.3f} {end:11.1f} {proc:11.1f} {out:10.1f} {each:12.3f}"
          f" {spacing / each:15.2f}")
print(f"median: a request {st.median(r[1] for r in rows):.3f} ms of the intake, hand-overs "
      f"{st.median(r[0] for r in rows):.3f} ms apart, share "
      f"{st.median(r[0] / r[1] for r in rows):.2f}")
