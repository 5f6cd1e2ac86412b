"""Issue 22's load scenarios wave by wave: the saved H200 record's groups of first tokens beside
the ones the plan's simulated vLLM scheduler produced for the same case.

    python benchmarks/gpu/issue22_simwaves.py RESULTS_DIR OUT_DIR [--scenario c32]
        [--case CASE ...] [--host-timing CASE=FILE ...] [--prompt-token-factor F]

OUT_DIR is an `issue22_now.py` output of RESULTS_DIR (its predictions.jsonl names the cases;
its cache/, where there is one, holds the kernel tables it re-keyed, which the plans here read
as issue22_now.py's did). Each case is planned again with issue22_now.py's `launcher plan`
arguments (``--host-timing`` as given to it) in a process whose ``loadsim.simulate`` records
the simulated run behind the plan's load figures; nothing the plan computes changes. For each
wave (a closed loop of N streams sends N requests at once, and each stream its next as its
last ends): TTFT p50 measured and simulated, the groups of first tokens (count@seconds
after the wave's first send, issue22_waves.groups), and when the wave's requests ended, in ms
after its first one ended (:func:`ends`): each end sends the stream's next request, so the
next wave's order is read there. A 32-stream TTFT p50 sits between such groups, so a figure
that misses by a group is read here, not in the p50. Agreement, not validation: the records
were measured before.

With ``--scenario long16-c4`` the ends show a race the 16k TTFT p50 turns on: a 16,384-token
prompt is two full 8,192-token steps only where nothing else takes budget, and the earlier
wave's decoders take a token each a step, so the prompt's last tokens need a third step; the
next prompt sent before that step is chosen fills it with its own first chunk (a whole chunk
step later). Whether a wave's second request ends a decode step or a chunk step after its
first (the next request on its way in against the decode steps it still has) decides it.

``--prompt-token-factor F`` is an experiment, not the plan: the simulated way in takes each
prompt token at the host's timed per-token functions x F instead of x
hardware.UNTIMED_PATH_FACTOR (the output path's factor, which the plan applies to both paths);
F = 1 is the timed functions alone (loadgen sends token ids: no tokenizer on the way in).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
FACTOR_ENV = "ISSUE22_SIMWAVES_PROMPT_TOKEN_FACTOR"  # --prompt-token-factor, to the plan process


def inner(out: Path, plan_args: list[str]) -> int:
    """``launcher plan PLAN_ARGS`` with every loadsim.simulate run recorded to ``out``."""
    sys.path.insert(0, str(ROOT))
    from launcher.planner import loadsim
    from launcher.planner.schedsim import simulate as real  # what loadsim calls

    runs: list[dict[str, Any]] = []

    def recorded(lim: Any, timer: Any, work: Any, **kw: Any) -> Any:
        res = real(lim, timer, work, **kw)
        runs.append({"prompt": work.prompt, "concurrency": work.concurrency,
                     "requests": [[r.sent_s, r.ttft_s, r.finished_s] for r in res.requests]})
        return res

    setattr(loadsim, "simulate", recorded)  # noqa: B010 (the module's name, replaced)
    factor = os.environ.get(FACTOR_ENV)
    if factor:
        from dataclasses import replace

        from launcher.planner.hardware import UNTIMED_PATH_FACTOR

        run = loadsim.loadgen_run
        scale = float(factor) / UNTIMED_PATH_FACTOR

        def rescaled(m: Any, lay: Any, f: Any, **kw: Any) -> Any:
            host = replace(lay.host, prompt_token_s=lay.host.prompt_token_s * scale)
            return run(m, replace(lay, host=host), f, **kw)

        setattr(loadsim, "loadgen_run", rescaled)  # noqa: B010 (the module's name, replaced)
    return plan_recorded(plan_args, out, runs)


def plan_recorded(plan_args: list[str], out: Path, runs: list[dict[str, Any]]) -> int:
    """``launcher plan PLAN_ARGS`` in this process, whose recorders (put in by the caller) fill
    ``runs``; ``runs`` written to ``out`` whether the plan ends well or not."""
    import runpy

    sys.argv = ["launcher", "plan", *plan_args]
    try:
        runpy.run_module("launcher", run_name="__main__")
    except SystemExit as e:
        if e.code not in (0, None):
            raise
    finally:
        out.write_text(json.dumps(runs))
    return 0


def waves(reqs: list[tuple[float, float, float]], n: int
          ) -> list[list[tuple[float, float, float]]]:
    """(sent, ttft, end) triples in waves of ``n`` by send time."""
    rs = sorted(reqs)
    return [rs[i:i + n] for i in range(0, len(rs), n)]


def ends(wave: list[tuple[float, float, float]]) -> str:
    """When a wave's requests ended, in whole ms after its first one ended, ascending: "0 9 55
    167". Each end is the stream's next send."""
    done = sorted(e for _, _, e in wave)
    return " ".join(f"{(e - done[0]) * 1e3:.0f}" for e in done)


def replay_topology(out: Path, case: str) -> Path:
    """The H200 reading ``case`` was replayed on in ``out`` (issue22_now.py writes it there: the
    machine's reading, with the GPU figures the case's probe kept where the table has them), so
    that the simulated runs are the replay's plans; the saved reading itself only where the
    replay left none. Without this the runs planned on the lead's saved reading, whose GEMM
    rates no machine plan read (05da664), and came out apart from the plans beside them."""
    import issue22_now

    for path in (out / f"topology-{case}.json", out / "topology.json"):
        if path.is_file():
            return path
    return Path(issue22_now.TOPOLOGY)


def plan_args(case: str, scen: str, out: Path, host: Path | None) -> list[str]:
    """`launcher plan`'s arguments for ``case``'s ``scen`` as issue22_now.py planned it into
    ``out``: its replay topology (:func:`replay_topology`) and the case's UTIL scaled to that
    reading's GPU memory as issue22-table.sh served it (issue22_now.scaled_util: a table run on a
    lent H100 asks 0.71 of it for gemma12d's 0.4 of an H200), so that the simulated runs are the
    replay's plans. Without the scaling a H100 table's runs were planned at the H200's fraction
    of an 80 GB card: another KV budget, another plan than the one beside them."""
    import issue22_now
    import issue22_table

    topo = replay_topology(out, case)
    util = issue22_now.served_utils(topo)[case]
    comp = issue22_now.table_map("RANGE").get(case, issue22_now.RUNS_COMPILATION)
    return ["--json", "--model", str(issue22_now.MODELS / issue22_table.MODEL[case]),
            "--topology", str(topo), "--tp", "1", "--pp", "1", "--dp", "1",
            "--gpu-memory-utilization", str(util), *issue22_now.SCENARIOS[scen],
            *(["--host-timing", str(host)] if host else []),
            "--", "--load-format", "dummy", "--compilation-config", comp]


def simulated(case: str, scen: str, out: Path, hosts: dict[str, Path],
              factor: float | None = None) -> list[dict[str, Any]]:
    env = {FACTOR_ENV: str(factor)} if factor is not None else {}
    return replanned(__file__, case, scen, out, hosts.get(case), env)


def replanned(script: str, case: str, scen: str, out: Path, host: Path | None,
              extra_env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """``case``'s ``scen`` planned again with issue22_now.py's `launcher plan` arguments (the
    replay's topology and kernel tables in ``out``, ``host`` as --host-timing) by ``script
    --inner REC ARGS`` (``extra_env`` added to its environment), whose recorders write REC:
    the runs they recorded."""
    args = plan_args(case, scen, out, host)
    cache = out / "cache"
    import issue22_now

    # the tables' vLLM (issue22_now.TABLES_VLLM), as issue22_now.py's plans are made
    env = {**os.environ, "TOPOSERVE_VLLM_VERSION": issue22_now.TABLES_VLLM,
           **({"TOPOSERVE_CACHE": str(cache)} if cache.is_dir() else {}), **(extra_env or {})}
    with tempfile.TemporaryDirectory() as tmp:
        rec = Path(tmp) / "runs.json"
        got = subprocess.run([sys.executable, script, "--inner", str(rec), *args], cwd=ROOT,
                             env=env, capture_output=True, text=True, timeout=600)
        if not rec.exists():
            raise SystemExit(f"{case} {scen}: the plan failed: {got.stderr.strip()[-300:]}")
        runs: list[dict[str, Any]] = json.loads(rec.read_text())
        return runs


def planned_p50(planned: list[dict[str, Any]], case: str, scen: str) -> float | None:
    """The TTFT p50 of ``case``'s ``scen`` line in the replay's plans (None: no such line)."""
    for d in planned:
        if d.get("case") == case and d.get("scenario") == scen and "ttft_p50_s" in d:
            return float(d["ttft_p50_s"])
    return None


def chosen_run(runs: list[dict[str, Any]], p50_s: float | None) -> list[list[float]]:
    """The simulated run the plan's figures came from. A plan simulates every candidate layout,
    then the chosen one twice more with its way in at either end of the host's spread (the race
    check, 3e5141c), so the last run is one of those, not the plan's: the run whose TTFT p50
    is the plan's (to the 0.1 ms the plan's JSON keeps) is; the last only where none is (a plan
    from before the race check, or no p50 to match)."""
    from issue22_waves import p50

    if p50_s is not None:
        for run in runs:
            if abs(p50([t for _, t, _ in run["requests"]]) - p50_s) < 6e-5:
                return list(run["requests"])
    return list(runs[-1]["requests"])


def main(argv: list[str]) -> int:
    if argv[:1] == ["--inner"]:
        return inner(Path(argv[1]), argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--scenario", default="c32", choices=("c32", "long16-c4"))
    ap.add_argument("--case", action="append", default=[])
    ap.add_argument("--host-timing", action="append", default=[], metavar="CASE=FILE")
    ap.add_argument("--prompt-token-factor", type=float, default=None, metavar="F",
                    help="an experiment: the way in's per-token work at the timed functions x F")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(HERE))
    import issue22_now
    from issue22_waves import groups, p50

    # issue22_now.py --host-speed's records, then --host-timing's as given here
    hosts = {f.stem.removeprefix("host-"): f.resolve() for f in a.out.glob("host-*.json")}
    hosts.update({c: Path(f).resolve() for c, _, f in (h.partition("=") for h in a.host_timing)})
    if not (a.out / "predictions.jsonl").is_file():
        # OUT is a replay's folder (issue22_now.py RESULTS OUT), whose plans name the cases
        raise SystemExit(f"{a.out}: no predictions.jsonl: replay the table into it first "
                         f"(issue22_now.py {a.results} {a.out})")
    planned = [json.loads(x) for x in (a.out / "predictions.jsonl").read_text().splitlines()]
    cases = a.case or sorted({d["case"] for d in planned if d.get("scenario") == a.scenario})
    prompt, conc = (int(issue22_now.SCENARIOS[a.scenario][i]) for i in (1, 5))
    print("| case | wave | TTFT p50 measured | simulated | first tokens measured | simulated "
          "| ends (ms after the first) measured | simulated |")
    print("| --- | ---: | ---: | ---: | --- | --- | --- | --- |")
    for case in cases:
        f = a.results / case / f"{a.scenario}.json"
        if not f.exists():
            continue
        d = json.loads(f.read_text())
        meas = [(r["t_sent_s"], r["ttft_s"], r["t_sent_s"] + r["e2e_s"]) for r in d["requests"]
                if r.get("error") is None]
        runs = [r for r in simulated(case, a.scenario, a.out, hosts, a.prompt_token_factor)
                if r["prompt"] == prompt and r["concurrency"] == conc]
        if not runs:
            print(f"| {case} | — | no simulated run of {conc} x {prompt} | | | | | |")
            continue
        sim = [(s, t, e) for s, t, e in chosen_run(runs, planned_p50(planned, case, a.scenario))]
        mw, sw = waves(meas, conc), waves(sim, conc)
        for i in range(max(len(mw), len(sw))):
            cells = []
            for w in (mw, sw):
                cells.append(f"{p50([t for _, t, _ in w[i]]):.3f}" if i < len(w) else "—")
            shown = [groups([{"t_sent_s": s, "ttft_s": t} for s, t, _ in w[i]]) if i < len(w)
                     else "—" for w in (mw, sw)]
            done = [ends(w[i]) if i < len(w) else "—" for w in (mw, sw)]
            print(f"| {case} | {i + 1} | {cells[0]} | {cells[1]} | {shown[0]} | {shown[1]} "
                  f"| {done[0]} | {done[1]} |")
        n = len(meas)
        print(f"| {case} | all | {p50([t for _, t, _ in meas]):.3f} | "
              f"{p50([t for _, t, _ in sim]):.3f} (first {n}: "
              f"{p50([t for _, t, _ in sorted(sim)[:n]]):.3f}) | | | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
