"""What benchmarks/gpu/host_speed.py's rows say of a host: its two speeds, a running thread's window
against the sleeping sampler, and the sweep's pace by duty cycle and by CPU.

    python benchmarks/gpu/host_speed_read.py RESULTS_DIR_OR_host-speed.jsonl ...

Per file, the sleeping sampler's reference (ref_cpu_ms, the least of 5 runs every --interval: 5 s
to session 28, 1 s since; the level-follows figures below are per sample, so read them at the
file's interval): its fast level (the 5th percentile), median, harmonic mean (the pace a thread
working through the whole run kept) and the share of samples at the slow level (over SLOW x the
fast level), with how much a sample's level follows the one before (P(slow | the sample before
slow) against P(slow | fast): alike, the level is drawn afresh every few seconds). Where the rows
have --busy's windows (a thread that never sleeps for a second, right after the sampler's 5 runs):
the median of a window's first run over its mean, the shares of windows whose first run / mean is
at the fast level, and of the windows that mix the two levels, the share whose first run is fast (a
thread that starts fast after idling then drops would put this near 1), and how often the sleeping
sampler's level is the window's. Then each sweep row (host_speed.py --duty / --per-cpu): per duty
the median, p90, a burst's first run and its later runs, and the median over the median at the
highest duty (below 1: bursts separated by idle run faster than a thread that never sleeps); per
CPU the spread of the pinned medians (max over min, and the slowest CPUs). Where the rows have
--threads-match's "threads" (and --pin-ms's "pinned"): per row the engine core's thread (else the
busiest matching one), which CPUs it sat on and how often, and the reference pinned
on its CPU against the sleeping sampler's in the same row: the level of the vCPU the engine used
beside the level the sampler read. Where the entries of a per-CPU pass or of "pinned" have "parts"
(host_speed.py --parts-share: the reference's json, pickle and sha256 parts and a plain
interpreter loop, each timed alone on that CPU right after the reference): per part, and for the
reference itself, the spread across the entries (most over least), its median on the entries where
the reference ran at the slow level over its median on the others (a part the slow level slows as
much as the reference shows the reference's ratio; one it leaves alone, ~1), and its correlation
with the reference's figure: whether a slow vCPU slows every kind of work alike. """

from __future__ import annotations

import contextlib
import itertools
import math
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parent))  # jsonl_rows, when loaded by path (tests)
from jsonl_rows import read_rows

# the slow level: a run this much slower than the fast level (host_speed.SLOW)
SLOW = 1.4
# the fast level of a file: this quantile of its fastest figures (the few runs below it are noise)
FAST_Q = 0.05

Row = dict[str, Any]
# host_speed.PARTS' names, in its order
PARTS = ("json", "pickle", "sha256", "loop")


def _num(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def parse(text: str) -> tuple[list[Row], int]:
    """host-speed.jsonl's rows (objects with a positive ref_cpu_ms) and the count of other
    non-blank lines (a line cut by a killed sampler, anything else): never raises."""
    return read_rows(text.splitlines(), _row)


def _row(value: object) -> Row | None:
    return value if isinstance(value, dict) and _num(value.get("ref_cpu_ms")) else None


def quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def levels(rows: list[Row]) -> dict[str, float]:
    """The sleeping sampler's two levels (the module's docstring)."""
    ref = [float(r["ref_cpu_ms"]) for r in rows]
    fast = quantile(ref, FAST_Q)
    slow = [x > SLOW * fast for x in ref]
    after_slow = [b for a, b in itertools.pairwise(slow) if a]
    after_fast = [b for a, b in itertools.pairwise(slow) if not a]
    out = {"n": len(ref), "fast_ms": fast, "med_ms": quantile(ref, 0.5),
           "hmean_ms": len(ref) / sum(1 / x for x in ref), "slow_share": sum(slow) / len(ref)}
    if after_slow:
        out["p_slow_after_slow"] = sum(after_slow) / len(after_slow)
    if after_fast:
        out["p_slow_after_fast"] = sum(after_fast) / len(after_fast)
    return out


def windows(rows: list[Row]) -> dict[str, float] | None:
    """The --busy windows against their first run and the sampler (the module's docstring);
    None where no row has one."""
    b = [r for r in rows if all(_num(r.get(k)) for k in
                                ("busy_first_ms", "busy_mean_ms", "busy_min_ms"))]
    if not b:
        return None
    fast = quantile([float(r["busy_min_ms"]) for r in b], FAST_Q)
    ref_fast = quantile([float(r["ref_cpu_ms"]) for r in rows], FAST_Q)

    def at_fast(x: float) -> bool:
        return x < SLOW * fast

    mixed = [r for r in b if not at_fast(r["busy_mean_ms"]) and at_fast(r["busy_min_ms"])]
    out = {"n": len(b), "fast_ms": fast,
           "first_over_mean": quantile([r["busy_first_ms"] / r["busy_mean_ms"] for r in b], 0.5),
           "first_fast": sum(at_fast(r["busy_first_ms"]) for r in b) / len(b),
           "mean_fast": sum(at_fast(r["busy_mean_ms"]) for r in b) / len(b),
           "mixed": len(mixed) / len(b),
           "sampler_agrees": sum((r["ref_cpu_ms"] > SLOW * ref_fast)
                                 == (not at_fast(r["busy_mean_ms"])) for r in b) / len(b),
           "hmean_ms": len(b) / sum(1 / r["busy_mean_ms"] for r in b)}
    if mixed:
        out["mixed_first_fast"] = sum(at_fast(r["busy_first_ms"]) for r in mixed) / len(mixed)
    return out


def duty_table(row: Row) -> list[dict[str, float]]:
    """A sweep row's duties, lowest first, each with ``rel``: its median over the median at the
    highest duty swept (the thread that sleeps least)."""
    duty = [d for d in row.get("duty") or [] if isinstance(d, dict)
            and _num(d.get("duty")) and _num(d.get("med_ms"))]
    if not duty:
        return []
    duty.sort(key=lambda d: d["duty"])
    top = duty[-1]["med_ms"]
    return [{**d, "rel": d["med_ms"] / top} for d in duty]


def cpu_spread(row: Row) -> dict[str, Any] | None:
    """A sweep row's per-CPU medians: their least, median and most, most over least, the CPUs
    over SLOW x the least (the slow ones), and each CPU's share of runs at the fast level (as
    text); None without a per-CPU pass."""
    cpus = [c for c in row.get("per_cpu") or [] if isinstance(c, dict) and _num(c.get("med_ms"))]
    if not cpus:
        return None
    meds = [c["med_ms"] for c in cpus]
    low = min(meds)
    return {"n": len(cpus), "min_ms": low, "med_ms": quantile(meds, 0.5), "max_ms": max(meds),
            "spread": max(meds) / low,
            "slow_cpus": [c.get("cpu") for c in cpus if c["med_ms"] > SLOW * low],
            "fast_shares": " ".join(f"{c.get('cpu')}:{c['fast_share']:.0%}" for c in cpus
                                    if isinstance(c.get("fast_share"), (int, float)))}


# vLLM's engine core titles its process so (the kernel keeps 15 characters of a thread's name)
ENGINE_CORE = "VLLM::EngineCor"


def engine_cpus(rows: list[Row]) -> dict[str, Any] | None:
    """The engine core's thread per row (host_speed.py --threads-match), or where a row has none
    of that name its busiest recorded thread (the API server's, while the engine core waits: it
    was the busiest in a third of table 16's rows, host-threads-t16.md): its name, the rows
    it was seen in, its CPUs and how many rows each (as text, most first), and where the row also
    timed the reference pinned on that CPU: that pinned fastest run's median and harmonic mean
    over the rows, the share of rows it is at the fast level (under SLOW x the file's fast level of
    the pinned runs) and the share where the sleeping sampler's run was at the fast level too
    (under SLOW x its own fast level). None without any thread recorded."""
    top: list[tuple[Row, Row]] = []
    for r in rows:
        ts = [t for t in r.get("threads") or [] if isinstance(t, dict)
              and isinstance(t.get("cpu"), int) and _num(t.get("cpu_s"))]
        core = [t for t in ts if str(t.get("name", "")).startswith(ENGINE_CORE)]
        if core or ts:
            top.append((r, max(core or ts, key=lambda t: t["cpu_s"])))
    if not top:
        return None
    counts: dict[int, int] = {}
    for _, t in top:
        counts[t["cpu"]] = counts.get(t["cpu"], 0) + 1
    out: dict[str, Any] = {
        "n": len(top), "name": top[0][1].get("name", "?"),
        "engine_rows": sum(str(t.get("name", "")).startswith(ENGINE_CORE) for _, t in top),
        "cpus": " ".join(f"{c}:{k}" for c, k in sorted(counts.items(), key=lambda x: -x[1]))}
    pinned: list[tuple[float, float]] = []  # (pinned fastest on the thread's CPU, sampler's)
    for r, t in top:
        for p in r.get("pinned") or []:
            if isinstance(p, dict) and p.get("cpu") == t["cpu"] and _num(p.get("min_ms")):
                pinned.append((p["min_ms"], r["ref_cpu_ms"]))
                break
    if pinned:
        pins = [p for p, _ in pinned]
        fast_pin = quantile(pins, FAST_Q)
        fast_ref = quantile([r["ref_cpu_ms"] for r in rows], FAST_Q)
        out.update({"pinned_n": len(pins), "pinned_med_ms": quantile(pins, 0.5),
                    "pinned_hmean_ms": len(pins) / sum(1 / p for p in pins),
                    "pinned_fast": sum(p < SLOW * fast_pin for p in pins) / len(pins),
                    "sampler_fast": sum(s < SLOW * fast_ref for _, s in pinned) / len(pinned)})
    return out


def part_spread(entries: object, key: str) -> dict[str, Any] | None:
    """The reference's parts across entries (one a CPU of a per-CPU pass, or a file's pinned
    entries), each entry read at ``key`` (med_ms for a per-CPU pass, min_ms for the pinned ones:
    a few runs, whose fastest is the level): per part (and "ref", the reference itself) n, least,
    most, spread (most over least), slow_over_fast (its median on the entries whose reference is
    over SLOW x the entries' fast level, over its median on the others, where both exist) and corr
    (its correlation with the reference's figure over the entries with both, where 3 or more and
    neither side is constant);
    "slow_n" the entries at the slow level. None without an entry holding both the reference's
    figure and a part's."""
    rows = [e for e in entries if isinstance(e, dict) and _num(e.get(key))
            and isinstance(e.get("parts"), dict)] if isinstance(entries, list) else []
    figs: dict[str, list[tuple[float, float]]] = {}  # part -> (reference's figure, part's)
    for e in rows:
        figs.setdefault("ref", []).append((e[key], e[key]))
        for name in PARTS:
            part = e["parts"].get(name)
            if isinstance(part, dict) and _num(part.get(key)):
                figs.setdefault(name, []).append((e[key], part[key]))
    if len(figs) < 2:
        return None
    fast = quantile([r for r, _ in figs["ref"]], FAST_Q)
    out: dict[str, Any] = {"slow_n": sum(r > SLOW * fast for r, _ in figs["ref"])}
    for name in ("ref", *PARTS):
        pairs = figs.get(name)
        if not pairs:
            continue
        vals = [v for _, v in pairs]
        got: dict[str, float] = {"n": len(vals), "min_ms": min(vals), "max_ms": max(vals),
                                 "spread": max(vals) / min(vals)}
        slow = [v for r, v in pairs if r > SLOW * fast]
        quick = [v for r, v in pairs if r <= SLOW * fast]
        if slow and quick:
            got["slow_over_fast"] = quantile(slow, 0.5) / quantile(quick, 0.5)
        if len(pairs) >= 3:  # through two points any line passes: r = +-1 says nothing
            with contextlib.suppress(statistics.StatisticsError):  # one side constant
                got["corr"] = statistics.correlation([r for r, _ in pairs], vals)
        out[name] = got
    return out


def _parts_line(p: dict[str, Any]) -> str:
    """One part_spread as text: each part's spread, slow-over-fast ratio and correlation."""
    cells = []
    for name in ("ref", *PARTS):
        g = p.get(name)
        if not g:
            continue
        cells.append(f"{name} x{g['spread']:.2f}"
                     + (f" slow/fast x{g['slow_over_fast']:.2f}" if "slow_over_fast" in g else "")
                     + (f" r {g['corr']:.2f}" if "corr" in g and name != "ref" else ""))
    return "; ".join(cells)


def _fmt(x: object) -> str:
    return f"{x:.3f}" if isinstance(x, (int, float)) else "?"


def report(name: str, rows: list[Row], bad: int) -> list[str]:
    """The printed lines of one file."""
    if not rows:
        return [f"{name}: no rows ({bad} other lines)"]
    lv = levels(rows)
    out = [f"{name}: {lv['n']} samples{f' ({bad} other lines)' if bad else ''}; sampler reference "
           f"fast {lv['fast_ms']:.3f} ms, median {lv['med_ms']:.3f}, harmonic mean "
           f"{lv['hmean_ms']:.3f}, slow (> x{SLOW} fast) {lv['slow_share']:.0%}"
           + (f"; P(slow | before slow) {lv['p_slow_after_slow']:.2f}, P(slow | before fast) "
              f"{lv['p_slow_after_fast']:.2f}" if "p_slow_after_slow" in lv
              and "p_slow_after_fast" in lv else "")]
    w = windows(rows)
    if w:
        out.append(f"  never-sleeping 1-s windows ({w['n']}): fast {w['fast_ms']:.3f} ms; "
                   f"first run / mean median {w['first_over_mean']:.2f}; first run at fast level "
                   f"{w['first_fast']:.0%}, mean at fast level {w['mean_fast']:.0%}; mixed "
                   f"{w['mixed']:.0%}"
                   + (f", of them first run fast {w['mixed_first_fast']:.0%}"
                      if "mixed_first_fast" in w else "")
                   + f"; sampler's level = window's {w['sampler_agrees']:.0%}; windows' harmonic "
                   f"mean {w['hmean_ms']:.3f} ms")
    e = engine_cpus(rows)
    if e:
        out.append(f"  the engine core's thread ({e['engine_rows']} rows; else the busiest "
                   f"matching) in {e['n']} rows: CPUs (rows) "
                   f"{e['cpus']}"
                   + (f"; reference pinned on its CPU ({e['pinned_n']} rows): median "
                      f"{e['pinned_med_ms']:.3f} ms, harmonic mean {e['pinned_hmean_ms']:.3f}, "
                      f"at its fast level {e['pinned_fast']:.0%} (the sampler in the same rows "
                      f"{e['sampler_fast']:.0%})" if "pinned_n" in e else ""))
    pins = [p for r in rows for p in (r.get("pinned") or [])]
    pp = part_spread(pins, "min_ms")
    if pp:
        out.append(f"  pinned parts ({pp['ref']['n']} entries, {pp['slow_n']} with the reference "
                   f"slow; fastest run, most/least): {_parts_line(pp)}")
    for r in rows:
        if "sweep" not in r:
            continue
        out.append(f"  sweep '{r['sweep']}' at t={r.get('t')} ({r.get('sweep_s', '?')} s):")
        for d in duty_table(r):
            burst = (f"first {d['first_med_ms']:.3f} / rest {d['rest_med_ms']:.3f}"
                     if _num(d.get("first_med_ms")) and _num(d.get("rest_med_ms")) else "")
            fast = (f", at the fast level {d['fast_share']:.0%}"
                    if isinstance(d.get("fast_share"), (int, float)) else "")
            out.append(f"    duty {d['duty']:5.1f}% (burst {d.get('burst_ms', '?')} ms, gap "
                       f"{d.get('gap_ms', '?')} ms, {d.get('runs', '?')} runs): median "
                       f"{d['med_ms']:.3f} ms (x{d['rel']:.2f} the top duty's), p90 "
                       f"{_fmt(d.get('p90_ms'))}, mean {_fmt(d.get('mean_ms'))}{fast}; {burst}")
        c = cpu_spread(r)
        if c:
            out.append(f"    per CPU ({c['n']}): median {c['min_ms']:.3f} / {c['med_ms']:.3f} / "
                       f"{c['max_ms']:.3f} ms (least / median / most), most/least "
                       f"x{c['spread']:.2f}; slow CPUs {c['slow_cpus'] or 'none'}; at the "
                       f"fast level per CPU {c['fast_shares']}")
        cp = part_spread(r.get("per_cpu"), "med_ms")
        if cp:
            out.append(f"    per CPU parts ({cp['slow_n']} CPUs with the reference slow; median "
                       f"run, most/least): {_parts_line(cp)}")
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.splitlines()[3].strip(), file=sys.stderr)
        return 2
    for a in argv:
        p = Path(a)
        if p.is_dir():
            p = p / "host-speed.jsonl"
        try:
            text = p.read_text(errors="replace")
        except OSError as e:
            print(f"{a}: {e}")
            continue
        print("\n".join(report(str(p), *parse(text))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
