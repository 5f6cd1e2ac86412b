"""The 32-stream first tokens of the saved H200 records, wave by wave, beside the plan.

    python benchmarks/gpu/issue22_waves.py RESULTS_DIR [PREDICTIONS.jsonl]

loadgen's closed loop (`--concurrency 32 --requests 64 --warmup 8`, run_config.sh) sends 32
requests at once and each of the 32 workers its second when its first ends, so a record holds
two waves. The first ran right after a warm-up of 8 requests (one 4,096-token step), the second
after 32 streams' own steps. For each case: TTFT p50 over all 64 (the table's figure), over the
first wave and over the second, the groups of first tokens (count@seconds after the wave's first
send), and the plan's p50 (`ttft_p50_s` of the c32 line of PREDICTIONS, e.g. what
`issue22_now.py` wrote) with its error against each. Read after the runs: agreement, not
validation.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def p50(values: list[float]) -> float:
    """The median as loadgen computes it (linear between the two middle values)."""
    v = sorted(values)
    k = (len(v) - 1) / 2
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def groups(wave: list[dict[str, float]]) -> str:
    """First tokens that came out together (within 2% of their time), as count@seconds after the
    wave's first send."""
    start = min(r["t_sent_s"] for r in wave)
    out: list[list[float]] = []
    for t in sorted(r["t_sent_s"] + r["ttft_s"] - start for r in wave):
        if out and t - out[-1][0] <= 0.02 * max(out[-1][0], 0.05):
            out[-1][1] += 1
        else:
            out.append([t, 1])
    return " ".join(f"{int(n)}@{t:.3f}" for t, n in out)


def predicted(path: Path | None) -> dict[str, float]:
    if path is None:
        return {}
    out = {}
    for line in path.read_text().splitlines():
        d = json.loads(line)
        if d.get("scenario") == "c32" and d.get("ttft_p50_s") is not None:
            out[str(d["case"])] = float(d["ttft_p50_s"])
    return out


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    root = Path(argv[0])
    plan = predicted(Path(argv[1]) if len(argv) > 1 else None)
    print("| case | p50 all 64 | wave 1 | wave 2 | plan | plan vs all / wave 1 / wave 2 "
          "| wave 1 first tokens | wave 2 first tokens |")
    print("| --- | ---: | ---: | ---: | ---: | --- | --- | --- |")
    for f in sorted(root.glob("*/c32.json")):
        d = json.loads(f.read_text())
        n = int(d["config"]["concurrency"])
        rs = sorted((r for r in d["requests"] if r.get("error") is None),
                    key=lambda r: r["t_sent_s"])
        waves = [rs[:n], rs[n:]]
        fig = [p50([r["ttft_s"] for r in w]) for w in ([*rs], *waves) if w]
        if len(fig) < 3:
            continue
        pl = plan.get(f.parent.name)
        err = (" / ".join(f"{(pl / m - 1) * 100:+.0f}%" for m in fig) if pl is not None
               else "—")
        print(f"| {f.parent.name} | {fig[0]:.3f} | {fig[1]:.3f} | {fig[2]:.3f} | "
              f"{'—' if pl is None else f'{pl:.3f}'} | {err} | {groups(waves[0])} | "
              f"{groups(waves[1])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
