"""Issue 22's 32-stream burst step by step: what each step of the plan's simulated vLLM
scheduler held, beside the saved H200 record's first wave.

    python benchmarks/gpu/issue22_simsteps.py RESULTS_DIR OUT_DIR [--scenario c32]
        [--case CASE ...] [--host-timing CASE=FILE ...] [--steps N] [--all-runs]

OUT_DIR is an `issue22_now.py` output of RESULTS_DIR, as for issue22_simwaves.py (its cases, its
re-keyed kernel tables in cache/, its topology files; a host-cost-CASE.json in RESULTS_DIR is
given to the plan as --host-timing, as issue22_replay_all.sh gives it). Each case is planned
again with every `schedsim._step` of every simulated run recorded; nothing the plan computes
changes. One line a case: the scheduler's batched-token budget, the most tokens any step of any
run scheduled (and how many steps passed the budget: none can, as vLLM's
``Scheduler.schedule`` never does), the record's first wave (count@s, issue22_waves.groups),
then the run behind the plan's TTFT p50 (issue22_simwaves.chosen_run), its first N steps that
held prompt tokens: ``prompts p / tokens t [first tokens made f] @ end ms (L launch / G GPU)``,
the end after the wave's first send, ``L`` the engine core's launch of the step
(``timer.launch_s``: what the step before's outputs wait for under async scheduling) and
``G`` the step's GPU time (the kernel table's ``cost.step_s``). A step whose L reaches the next
step's G hands its first tokens over with the next step's: two steps' first tokens in one
group of issue22_simwaves.py's table, not one step past the budget. ``--all-runs`` adds a line
for every simulated run of the scenario (a plan runs the burst at its host's pace and at either
end of the pace's spread, loadsim's race check): its first wave's groups of first tokens, then its
steps as above, so that a run whose steps hold what the record's did can be read beside it.
Agreement, not validation.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def inner(out: Path, plan_args: list[str]) -> int:
    """``launcher plan PLAN_ARGS`` with each loadsim.simulate run's steps recorded to ``out``."""
    sys.path.insert(0, str(ROOT))
    from issue22_simwaves import plan_recorded

    from launcher.planner import loadsim, schedsim

    runs: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    real_step, real_sim = schedsim._step, loadsim.simulate

    def step(eng: Any, timer: Any, now: float, *rest: Any) -> Any:
        s = real_step(eng, timer, now, *rest)
        if s is not None:
            steps.append({
                "start": now, "end": s.now, "tokens": sum(s.chosen.values()),
                "prefill": s.batch.prefill_tokens, "decoders": s.batch.decode_seqs,
                "prompts": sum(1 for r in s.ran if s.chosen.get(id(r), 0) > 1),
                "firsts": sum(1 for r in s.ran if id(r) in s.chosen and r.outputs == 1
                              and r.first == s.now),
                "budget": eng.lim.max_num_batched_tokens,
                "launch_s": timer.launch_s(s.batch) if hasattr(timer, "launch_s") else None,
                "gpu_s": timer.cost.step_s(s.batch) if hasattr(timer, "cost") else None})
        return s

    def recorded(lim: Any, timer: Any, work: Any, **kw: Any) -> Any:
        steps.clear()
        res = real_sim(lim, timer, work, **kw)
        runs.append({"prompt": work.prompt, "concurrency": work.concurrency,
                     "requests": [[r.sent_s, r.ttft_s, r.finished_s] for r in res.requests],
                     "steps": list(steps)})
        return res

    setattr(schedsim, "_step", step)  # noqa: B010 (the module's name, replaced)
    setattr(loadsim, "simulate", recorded)  # noqa: B010
    return plan_recorded(plan_args, out, runs)


def simulated(case: str, scen: str, out: Path, host: Path | None) -> list[dict[str, Any]]:
    """The case's simulated runs, each with its steps (issue22_simwaves.simulated's plan)."""
    from issue22_simwaves import replanned

    return replanned(__file__, case, scen, out, host)


def shown(step: dict[str, Any], t0: float) -> str:
    def ms(x: float | None) -> str:
        return "?" if x is None else f"{x * 1e3:.0f}"
    return (f"{step['prompts']}p/{step['prefill']}t[{step['firsts']}f]@{ms(step['end'] - t0)}"
            f"(L{ms(step['launch_s'])}/G{ms(step['gpu_s'])})")


def main(argv: list[str]) -> int:
    if argv[:1] == ["--inner"]:
        return inner(Path(argv[1]), argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--scenario", default="c32", choices=("c32", "long16-c4"))
    ap.add_argument("--case", action="append", default=[])
    ap.add_argument("--host-timing", action="append", default=[], metavar="CASE=FILE")
    ap.add_argument("--steps", type=int, default=4, help="prompt steps shown a case")
    ap.add_argument("--all-runs", action="store_true",
                    help="a line for every simulated run of the scenario, not only the plan's")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(HERE))
    import issue22_now
    from issue22_simwaves import chosen_run, planned_p50
    from issue22_waves import groups

    hosts = {f.stem.removeprefix("host-cost-"): f.resolve()
             for f in a.results.glob("host-cost-*.json")}
    hosts.update({c: Path(f).resolve() for c, _, f in (h.partition("=") for h in a.host_timing)})
    planned = [json.loads(x) for x in (a.out / "predictions.jsonl").read_text().splitlines()]
    cases = a.case or sorted({d["case"] for d in planned if d.get("scenario") == a.scenario})
    prompt, conc = (int(issue22_now.SCENARIOS[a.scenario][i]) for i in (1, 5))
    for case in cases:
        f = a.results / case / f"{a.scenario}.json"
        if not f.exists():
            continue
        reqs = sorted(json.loads(f.read_text())["requests"], key=lambda r: r["t_sent_s"])
        runs = simulated(case, a.scenario, a.out, hosts.get(case))
        every = [s for r in runs for s in r["steps"]]
        over = sum(1 for s in every if s["tokens"] > s["budget"])
        budgets = sorted({s["budget"] for s in every})
        mine = [r for r in runs if r["prompt"] == prompt and r["concurrency"] == conc]
        chosen = chosen_run(mine, planned_p50(planned, case, a.scenario)) if mine else []
        run = next((r for r in mine if r["requests"] == chosen), None)
        most = max((s["tokens"] for s in every), default=0)
        line = (f"{case}: budget {budgets}, most in a step {most}, "
                f"{over} steps over; measured {groups(reqs[:conc])}")
        if run is not None:
            t0 = min(q[0] for q in run["requests"])
            pre = [s for s in run["steps"] if s["prefill"]][:a.steps]
            line += "; simulated " + " ".join(shown(s, t0) for s in pre)
        print(line, flush=True)
        for r in mine if a.all_runs else []:
            t0 = min(q[0] for q in r["requests"])
            wave = [{"t_sent_s": q[0], "ttft_s": q[1]} for q in sorted(r["requests"])[:conc]]
            pre = [s for s in r["steps"] if s["prefill"]][:a.steps]
            print(f"  run: {groups(wave)}; " + " ".join(shown(s, t0) for s in pre), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
