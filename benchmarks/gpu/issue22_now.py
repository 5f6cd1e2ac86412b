"""Issue 22's table cases as the planner at this commit predicts them, beside the measurements:
`launcher plan --json` of every case and scenario `issue22-table.sh predict` planned on the
H200, here on the H200's saved NVML reading (not on the machine), written with links to the
measured folders so that `issue22_table.py` reads them as it reads the machine's predictions.

    python benchmarks/gpu/issue22_now.py RESULTS_DIR OUT_DIR [--topology FILE] [--predictions F]
        [--host-speed CASE=RATIO ...] [--host-timing CASE=FILE ...] [--kernels FILE]
    python benchmarks/gpu/issue22_table.py OUT_DIR

Computed after the measurements, so its figures are agreement, not validation; the machine's
own predictions (RESULTS_DIR/predictions.jsonl) are never rewritten.

``--host-speed CASE=RATIO`` plans CASE for a serving host that ran the timed front-end functions
in RATIO of the time the shipped profile's host did (`launcher plan --host-timing` with the
H200 host's timed figures x RATIO): no record holds a `probe --measure` timing of its host, so
the ratio is read from the record's own host-only work (docs/planner.md says which).

``--kernels FILE`` plans with the kernel tables `probe --measure --model` timed on the machine
(a results folder's kernels.tgz, or a folder of the tables' JSON files), as its plans after the
probe did: a plan finds a table by the installed vLLM's and torch's versions, which here are not
the machine's, so each table is kept under OUT_DIR/cache with its key's versions replaced by
this checkout's (device and driver as timed, the --topology's driver must be the table's; the
shape as timed unless this checkout's step shape of the model has changed, whose new ops then
come from the roofline) and the plans run with TOPOSERVE_CACHE there.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "benchmarks" / "gpu" / "models"
TOPOLOGY = ROOT / "benchmarks" / "gpu" / "results" / "2026-12-01-h200-lead" / "h200-probe.json"
# as issue22-table.sh plans them: scenario -> plan arguments
SCENARIOS = {
    "single": ["--prompt", "512", "--gen", "256", "--concurrency", "1"],
    "c32": ["--prompt", "512", "--gen", "256", "--concurrency", "32"],
    "long16-c1": ["--prompt", "16384", "--gen", "128", "--concurrency", "1"],
    "long16-c4": ["--prompt", "16384", "--gen", "128", "--concurrency", "4"],
    **{f"depth{d}": ["--workload", "agent", "--sessions", "1", "--context", str(d),
                     "--prompt", "512", "--gen", "64"] for d in (8000, 32000)},
}


def host_timing_file(out: Path, case: str, ratio: float) -> Path:
    """A host timing for CASE's run: the shipped profile's timed figures x ``ratio``."""
    from launcher.planner import hardware
    from launcher.probe import hostcost

    rec = hostcost.HostTiming(
        hostcost.HostKey(f"the H200 host of {case}'s run (x{ratio:g} of the shipped one's "
                         "timed work, from its logs)", 16, "0.26.0"),
        hardware.H200_HOST_TOKEN_TIMED_S * ratio, 1e-4, hardware.H200_HOST_STEP_TIMED_S * ratio,
        hardware.H200_HOST_SEQ_TIMED_S * ratio, "read from the record")
    path = out / f"host-{case}.json"
    path.write_text(json.dumps(hostcost.to_json(rec)))
    return path


def current_shape(timed: Any) -> Any:
    """This checkout's step shape of the model a table was timed for (``timed``, its shape), at
    the TP degree it was timed at: the one whose step shape has its query heads."""
    from launcher.model.modelspec import load_model_spec
    from launcher.planner.kernelcost import step_shape

    m = load_model_spec(MODELS / timed.name)
    shapes = [step_shape(m, tp) for tp in (1, 2, 4, 8)]
    return next((x for x in shapes if x.attention[0].heads == timed.attention[0].heads),
                shapes[0])


def reshaped(table: Any, shape: Any) -> Any:
    """``table`` under this checkout's step shape of its model where that has changed since
    the table was timed (a shape key the plan would not find): the ops the table has not
    timed (a linear added to the shape since) are marked untimed, so that the plan takes
    the roofline's figure for them (launcher.planner.tablegaps) and says so."""
    from dataclasses import replace

    if shape.key() == table.key.shape:
        return table
    timed = {t.op.removeprefix("eager:") for t in table.times}
    absent = tuple(f"linear:{x.name}" for x in shape.linears if f"linear:{x.name}" not in timed)
    print(f"{shape.name}: the table was timed for an older step shape; {', '.join(absent)} "
          "from the roofline", file=sys.stderr)
    return replace(table, shape=shape, key=replace(table.key, shape=shape.key()),
                   untimed=tuple(dict.fromkeys((*table.untimed, *absent))))


def kernel_cache(src: Path, out: Path) -> tuple[Path, list[str]]:
    """OUT/cache holding the kernel tables in ``src`` (a .tgz of them or a folder), re-keyed to
    this checkout's installed vLLM and torch versions and, where it changed, its step shape
    (:func:`reshaped`), and the tables' model names."""
    from dataclasses import replace

    from launcher.probe import kernelprobe, kernels

    if src.is_dir():
        raws = [f.read_text() for f in sorted(src.rglob("*.json"))]
    else:
        with tarfile.open(src) as tar:
            files = (tar.extractfile(m) for m in tar.getmembers() if m.name.endswith(".json"))
            raws = [f.read().decode() for f in files if f is not None]
    cache, names = out / "cache", []
    for raw in raws:
        table = kernels.table_from_json(json.loads(raw))
        table = reshaped(table, current_shape(table.shape))
        key = replace(table.key, vllm=kernelprobe.vllm_version(),
                      torch=kernelprobe.dist_version("torch"))
        if kernels.save(cache, replace(table, key=key)) is None:
            raise SystemExit(f"cannot write the kernel tables under {cache}")
        names.append(table.shape.name)
    return cache, names


# the engine flags the records' runs started vLLM with (benchmarks/gpu/run_config.sh; its
# CUDA-graph range decides how the plan times a prompt step): graphs to 64 tokens
RUNS_COMPILATION = ('{"cudagraph_capture_sizes":[1,2,4,8,16,32,64],'
                    '"pass_config":{"fuse_allreduce_rms":false}}')


def table_map(name: str) -> dict[str, str]:
    """issue22-table.sh's ``declare -A NAME=(...)`` (UTIL, RANGE): what each case was served
    with, read where the runs read it so that a case added there is planned as it ran."""
    text = (ROOT / "benchmarks" / "gpu" / "issue22-table.sh").read_text()
    body = re.search(rf"^declare -A {name}=\((.*?)\)$", text, re.M | re.S)
    if body is None:
        raise SystemExit(f"issue22-table.sh declares no {name}")
    return {k: v.strip("'\"") for k, v in re.findall(r"\[(\w+)\]=('[^']*'|\"[^\"]*\"|\S+)",
                                                     body.group(1))}


def plan_line(case: str, scen: str, model: str, util: float, topo: Path,
              host: Path | None = None, compilation: str = RUNS_COMPILATION,
              cache: Path | None = None) -> str:
    cmd = [sys.executable, "-m", "launcher", "plan", "--json", "--model", str(MODELS / model),
           "--topology", str(topo), "--tp", "1", "--pp", "1", "--dp", "1",
           "--gpu-memory-utilization", str(util), *SCENARIOS[scen],
           *(["--host-timing", str(host)] if host else []),
           "--", "--load-format", "dummy", "--compilation-config", compilation]
    env = {**os.environ, "TOPOSERVE_CACHE": str(cache)} if cache else None
    got = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300, env=env)
    try:
        d = json.loads(got.stdout)
    except ValueError:
        return json.dumps({"case": case, "scenario": scen,
                           "error": (got.stdout + got.stderr).strip()[-300:]})
    out = {"case": case, "scenario": scen, "max_model_len": d["max_model_len"], **d["predicted"]}
    if d.get("agent"):
        out["agent_rooms"] = d["agent"]["rooms"]
    return json.dumps(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--topology", type=Path, default=TOPOLOGY)
    ap.add_argument("--predictions", type=Path, default=None,
                    help="the machine's plans whose cases and scenarios are planned again "
                         "(default: RESULTS_DIR/predictions.jsonl)")
    ap.add_argument("--compilation-config", default=None,
                    help="the engine's --compilation-config the runs had (default: each case's "
                         "RANGE in issue22-table.sh, else graphs to 64 tokens as run_config.sh; "
                         "'{}' for the -default folders)")
    ap.add_argument("--host-speed", action="append", default=[], metavar="CASE=RATIO",
                    help="plan CASE for a host RATIO x as slow as the shipped profile's")
    ap.add_argument("--host-timing", action="append", default=[], metavar="CASE=FILE",
                    help="plan CASE with this host timing record (launcher plan --host-timing)")
    ap.add_argument("--kernels", type=Path, default=None,
                    help="plan with these kernel tables (a results folder's kernels.tgz, or a "
                         "folder of them), re-keyed to the installed vLLM and torch")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    sys.path.insert(0, str(ROOT))
    import issue22_table  # the same directory

    source = args.predictions or args.results / "predictions.jsonl"
    old = [json.loads(x) for x in source.read_text().splitlines()]
    # each case's --gpu-memory-utilization and CUDA-graph range as issue22-table.sh served it
    util = {k: float(v) for k, v in table_map("UTIL").items()}
    ranges = table_map("RANGE")
    jobs = [(d["case"], d["scenario"]) for d in old]
    args.out.mkdir(parents=True, exist_ok=True)
    hosts = {case: host_timing_file(args.out, case, float(ratio))
             for case, _, ratio in (h.partition("=") for h in args.host_speed)}
    hosts.update({case: Path(f).resolve()
                  for case, _, f in (h.partition("=") for h in args.host_timing)})
    cache = None
    if args.kernels:
        cache, names = kernel_cache(args.kernels, args.out)
        print(f"kernel tables of {', '.join(sorted(names))} -> {cache}")
    for case in {c for c, _ in jobs}:
        link = args.out / case
        if (args.results / case).is_dir() and not link.exists():
            link.symlink_to((args.results / case).resolve())
    with ThreadPoolExecutor(2) as pool:
        lines = list(pool.map(lambda j: plan_line(j[0], j[1], issue22_table.MODEL[j[0]],
                                                  util[j[0]], args.topology, hosts.get(j[0]),
                                                  args.compilation_config
                                                  or ranges.get(j[0], RUNS_COMPILATION),
                                                  cache),
                                   jobs))
    (args.out / "predictions.jsonl").write_text("\n".join(lines) + "\n")
    print(f"{len(lines)} plans -> {args.out / 'predictions.jsonl'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
