"""Issue 22's table cases as the planner at this commit predicts them, beside the measurements:
`launcher plan --json` of every case and scenario `issue22-table.sh predict` planned on the
H200, here on the H200's saved NVML reading (not on the machine), written with links to the
measured folders so that `issue22_table.py` reads them as it reads the machine's predictions.

    python benchmarks/gpu/issue22_now.py RESULTS_DIR OUT_DIR [--topology FILE] [--predictions F]
        [--host-speed CASE=RATIO ...] [--host-timing CASE=FILE ...] [--kernels FILE]
        [--gpu-perf CASE=FILE ...] [--measured-gpu]
    python benchmarks/gpu/issue22_table.py OUT_DIR

Computed after the measurements, so its figures are agreement, not validation; the machine's
own predictions (RESULTS_DIR/predictions.jsonl) are never rewritten.

``--host-speed CASE=RATIO`` plans CASE for a serving host that ran the timed front-end functions
in RATIO of the time the shipped profile's host did (`launcher plan --host-timing` with the
H200 host's timed figures x RATIO): no record holds a `probe --measure` timing of its host, so
the ratio is read from the record's own host-only work (docs/planner.md says which).

The topology is the saved NVML reading as the machine's own `launcher plan` read its GPUs:
live, through NVML alone. `probe --measure` on the machine keeps its GEMM rates, graph-kernel
cost and link figures for no later plan (only for a file, with --save: no saved launcher.out
of tables 1-13 plans "from figures measured on it"), so the plans here drop the ones
``--topology``'s file carries (:func:`machine_topology`); ``--measured-gpu`` keeps them. Since
d0434d7 `probe --measure` keeps each GPU's figures for the plans made after it on that machine:
a table run since saves the record (gpu-perf-CASE.json), and ``--gpu-perf CASE=FILE`` gives CASE's
replay those figures (:func:`with_kept_perf`). Each
plan is then compared with the machine's line field by field (:func:`disagreements`): at the
planner commit the machine ran, a replay must print "all N the machine's".

``--kernels FILE`` plans with the kernel tables `probe --measure --model` timed on the machine
(a results folder's kernels.tgz, or a folder of the tables' JSON files), as its plans after the
probe did: a plan finds a table by the installed vLLM's and torch's versions, which here are not
the machine's, so each table is kept under OUT_DIR/cache with its key's versions replaced by
this checkout's (device and driver as timed, the --topology's driver must be the table's; the
shape as timed unless this checkout's step shape of the model has changed, whose new ops then
come from the roofline) and the plans run with TOPOSERVE_CACHE there.

Each plan simulates the load its scenario's run measured: the requests loadgen's config in
RESULTS_DIR/CASE/SCENARIO.json counted (:func:`recorded_load`; tables 5 and 6 measured 64 at 32
streams, 2 a stream, where loadgen's default and the planner's simulation have 4 a stream), by
the planner's own simulation with its requests per stream set to the record's
(:data:`PLAN_AT`); a record that names no count is planned as today, with a printed note.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
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


# the notes `probe --measure` adds to a topology (measure.measure_topology), and the one the
# reader adds for a GPU's measured figures (topoparse._perf): none is in a live NVML reading
MEASURE_NOTE = re.compile(r"^(measured \d{4}-|GPU\d+ measured: |GPU\d+: planned from figures "
                          r"measured on it|one GPU: no link to measure|all-reduce gave WRONG)")


def machine_topology(src: Path, out: Path) -> Path:
    """``src`` (a saved topology) as the machine's `launcher plan` read its GPUs: through NVML
    alone (topology.load_topology without a path), without the figures `probe --measure
    --save` adds: each GPU's GEMM rates and graph-kernel cost ("measured", which the plan then
    takes over the datasheet's: H200 761 TFLOP/s measured against 989 x 0.7 = 692 shipped, the
    roofline's steps 9% apart) and each pair's link figures. A reading without them (an NVML
    dump) is used as it is."""
    data = json.loads(src.read_text())
    if not isinstance(data, dict) or data.get("format") is None:
        return src
    bare = {**data,
            "notes": [n for n in data.get("notes") or [] if not MEASURE_NOTE.match(str(n))],
            "gpus": [{k: v for k, v in g.items() if k != "measured"} if isinstance(g, dict) else g
                     for g in data.get("gpus") or []],
            "pairs": [{**p, "measured": None} if isinstance(p, dict) else p
                      for p in data.get("pairs") or []]}
    path = out / "topology.json"
    path.write_text(json.dumps(bare, indent=1) + "\n")
    return path


def with_kept_perf(topo: Path, kept: Path, out: Path, case: str) -> Path:
    """``topo`` (the machine's reading, :func:`machine_topology`) with every GPU's measured
    figures from ``kept``, the record `probe --measure` kept on the machine for its later plans
    (launcher/pipeline/gpuperfs.py, since d0434d7; issue22-table.sh's probe copies it to
    gpu-perf-CASE.json): the plans after that probe read them, so CASE's replay does."""
    from launcher.probe import gpuperf

    try:
        rec, reasons = gpuperf.kept_from_json(json.loads(kept.read_text()))
    except (OSError, ValueError) as exc:
        raise SystemExit(f"{kept}: cannot be read ({exc})") from None
    if rec is None:
        raise SystemExit(f"{kept}: {'; '.join(reasons)}")
    data = json.loads(topo.read_text())
    data["gpus"] = [{**g, "measured": gpuperf.perf_to_json(rec.perf)} if isinstance(g, dict)
                    else g for g in data.get("gpus") or []]
    path = out / f"topology-{case}.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def leaves(d: Any, at: str = "") -> dict[str, Any]:
    """A JSON value's leaves by path ("agent_rooms[0].ttft_recomputed_s"); an empty list or
    object is a leaf."""
    if isinstance(d, dict) and d:
        return {k: v for key, x in d.items()
                for k, v in leaves(x, f"{at}.{key}" if at else str(key)).items()}
    if isinstance(d, list) and d:
        return {k: v for i, x in enumerate(d) for k, v in leaves(x, f"{at}[{i}]").items()}
    return {at: d}


def _same(a: Any, b: Any) -> bool:
    """Two JSON leaves agree (numbers to a relative 1e-9: a float printed twice)."""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) \
            and not isinstance(a, bool) and not isinstance(b, bool):
        return abs(a - b) <= 1e-9 * max(abs(a), abs(b))
    return bool(a == b)


def disagreements(machine: list[dict[str, Any]], replay: list[dict[str, Any]]) -> list[str]:
    """Each leaf of a replayed plan that is not the machine's plan's for the same case and
    scenario, one line each ("case scenario field: machine -> replay"); a leaf only one side
    has counts too, but for the fields a machine's line has none of (an older
    issue22-table.sh's predict wrote no kernel_table, compilation_config). Empty: the replay
    is the machine's plan, field for field."""
    out = []
    mine = {(d.get("case"), d.get("scenario")): d for d in replay}
    for m in machine:
        name = f"{m.get('case')} {m.get('scenario')}"
        r = mine.get((m.get("case"), m.get("scenario")))
        if r is None:
            out.append(f"{name}: not replayed")
            continue
        a = leaves(m)
        b = {k: v for k, v in leaves(r).items() if re.split(r"[.\[]", k, maxsplit=1)[0] in m}
        out += [f"{name} {k}: {json.dumps(a.get(k, '(none)'))} -> {json.dumps(b.get(k, '(none)'))}"
                for k in dict.fromkeys((*a, *b))
                if k not in a or k not in b or not _same(a[k], b[k])]
    return out


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


def util_ref_mib() -> int:
    """The GPU memory (MiB) issue22-table.sh's UTIL fractions are of (its UTIL_REF_MIB, the
    H200's 143,771), read where the runs read it."""
    text = (ROOT / "benchmarks" / "gpu" / "issue22-table.sh").read_text()
    ref = re.search(r"^UTIL_REF_MIB=\$\{UTIL_REF_MIB:-(\d+)\}$", text, re.M)
    if ref is None:
        raise SystemExit("issue22-table.sh sets no UTIL_REF_MIB")
    return int(ref.group(1))


def scaled_util(util: float, ref_mib: int, gpu_mib: int) -> float:
    """A case's UTIL fraction (of ``ref_mib``) as issue22-table.sh served it on a GPU of
    ``gpu_mib`` MiB: the same bytes, capped at 0.92, to two decimals (its awk's "%.2f"), so
    that a table run on a lent H100 (81,559 MiB) is planned at the fraction its plans had."""
    if gpu_mib == ref_mib:
        return util
    return float(f"{min(util * ref_mib / gpu_mib, 0.92):.2f}")


def topology_gpu_mib(topo: Path) -> int | None:
    """The first GPU's memory in MiB as nvidia-smi's memory.total gives it (NVML's bytes over
    2**20, whole), which issue22-table.sh scales UTIL by; None when the reading has none."""
    data = json.loads(topo.read_text())
    gpus = data.get("gpus") if isinstance(data, dict) else None
    g = gpus[0] if isinstance(gpus, list) and gpus and isinstance(gpus[0], dict) else {}
    total = g.get("memory_bytes", g.get("memory_total"))
    return int(total) // 2**20 if isinstance(total, (int, float)) and total > 0 else None


def served_utils(topo: Path) -> dict[str, float]:
    """Each case's --gpu-memory-utilization as issue22-table.sh served it on the GPU of the
    reading ``topo``: its UTIL scaled to that GPU's memory (:func:`scaled_util`)."""
    ref_mib = util_ref_mib()
    gpu_mib = topology_gpu_mib(topo) or ref_mib
    return {k: scaled_util(float(v), ref_mib, gpu_mib) for k, v in table_map("UTIL").items()}


# what a plan reads of the machine it runs on besides its --topology and --host-timing: the
# GPUs a process sees, NCCL's transport, the host's free memory for KV offloading, and its
# cache (kernel tables, this host's front-end timing, the CPU engine's step): the machine's
# plans had none of this host's
PLAN_ENV_DROPPED = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NCCL_P2P_DISABLE",
                    "TOPOSERVE_HOST_FREE_GIB", "XDG_CACHE_HOME")

# the vLLM every table's engine ran (78 logged starts of results/2026-12-0*: "version 0.26.0"),
# whose CUDA-graph rule the machine's plans assumed; not the CPU build installed here, which
# leaves a GPU engine's release unknown (launcher/engine/detect.py served_vllm)
TABLES_VLLM = "0.26.0"


def plan_env(env: Mapping[str, str], cache: Path) -> dict[str, str]:
    """``env`` for a replayed plan: without :data:`PLAN_ENV_DROPPED`, its cache ``cache``
    (only the tables the replay keeps there: an absent one is an empty cache, not this host's
    ~/.cache/toposerve, whose `probe --measure` host timing a plan would take as the serving
    host's)."""
    return {**{k: v for k, v in env.items() if k not in PLAN_ENV_DROPPED},
            "TOPOSERVE_CACHE": str(cache), "TOPOSERVE_VLLM_VERSION": TABLES_VLLM}


@dataclass(frozen=True)
class RecordedLoad:
    """What a scenario's loadgen run measured, from its record's config: ``requests`` measured
    (None: the config names none, loadgen's default of its release), ``warmup`` unmeasured
    requests before them (None: not recorded), at ``concurrency`` streams."""

    requests: int | None
    warmup: int | None
    concurrency: int | None


def recorded_load(results: Path, case: str, scen: str) -> RecordedLoad | None:
    """The load RESULTS/CASE/SCEN.json's run measured (its loadgen ``config``); None where the
    scenario has no such record (the depth scenarios' runs are saved as depth-cold/-cached)."""
    path = results / case / f"{scen}.json"
    try:
        config = json.loads(path.read_text()).get("config")
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None

    def count(key: str) -> int | None:
        v = config.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None

    return RecordedLoad(count("requests"), count("warmup"), count("concurrency"))


def scenario_streams(scen: str) -> int | None:
    """The streams a scenario plans for (its --concurrency), None for one without (agent)."""
    args = SCENARIOS[scen]
    return int(args[args.index("--concurrency") + 1]) if "--concurrency" in args else None


def requests_per_stream(load: RecordedLoad | None, scen: str) -> tuple[int | None, str]:
    """The requests per stream a plan of ``scen`` simulates to be the run ``load`` measured,
    and the line saying so; None (the planner's own, loadgen's default of 4 a stream) where
    the record names no count. loadgen's warm-up is sent and answered before the measured
    requests start (loadgen/api.py), and the planner simulates a warm engine, so the recorded
    warm-up is said, not simulated. A count the streams do not divide evenly has no closed
    loop of equal streams in the planner's simulation: refused, not rounded."""
    streams = scenario_streams(scen)
    if streams is None:
        return None, f"{scen}: not a loadgen run at a concurrency; planned as today"
    if load is None or load.requests is None:
        return None, (f"{scen}: the record names no measured request count; planned as today "
                      "(the planner's default per stream)")
    if load.concurrency not in (None, streams):
        raise SystemExit(f"{scen}: the record ran {load.concurrency} streams, the scenario "
                         f"plans {streams}")
    per, left = divmod(load.requests, streams)
    if left or per < 1:
        raise SystemExit(f"{scen}: {load.requests} measured requests over {streams} streams "
                         "is no whole number a stream; the simulation sends equal streams")
    warm = "not recorded" if load.warmup is None else f"{load.warmup} (not simulated: warm engine)"
    return per, f"{scen}: {load.requests} measured requests ({per} a stream), warm-up {warm}"


# `launcher plan` with the planner's simulation sending argv[1] requests a stream
# (loadsim.LOADGEN_REQUESTS_PER_STREAM, which every simulated run and the plan's line read when
# they run): the same simulation, at the count the record measured
PLAN_AT = ("import sys\n"
           "from launcher.planner import loadsim\n"
           "loadsim.LOADGEN_REQUESTS_PER_STREAM = int(sys.argv.pop(1))\n"
           "from launcher.cli.main import main\n"
           "sys.exit(main())\n")


def plan_command(per_stream: int | None) -> list[str]:
    """The command a replayed plan starts with: `launcher plan`, sending ``per_stream``
    requests a stream where given (:data:`PLAN_AT`)."""
    if per_stream is None:
        return [sys.executable, "-m", "launcher", "plan"]
    return [sys.executable, "-c", PLAN_AT, str(per_stream), "plan"]


def plan_line(case: str, scen: str, model: str, util: float, topo: Path,
              host: Path | None, compilation: str,
              cache: Path, per_stream: int | None = None) -> str:
    """One plan's line as issue22-table.sh's predict writes it, planned with ``cache`` as its
    TOPOSERVE_CACHE (:func:`plan_env`) and ``per_stream`` requests a stream (None: the
    planner's default; :func:`requests_per_stream`)."""
    cmd = [*plan_command(per_stream), "--json", "--model", str(MODELS / model),
           "--topology", str(topo), "--tp", "1", "--pp", "1", "--dp", "1",
           "--gpu-memory-utilization", str(util), *SCENARIOS[scen],
           *(["--host-timing", str(host)] if host else []),
           "--", "--load-format", "dummy", "--compilation-config", compilation]
    got = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env=plan_env(os.environ, cache))
    try:
        d = json.loads(got.stdout)
    except ValueError:
        return json.dumps({"case": case, "scenario": scen,
                           "error": (got.stdout + got.stderr).strip()[-300:]})
    # the fields issue22-table.sh's predict writes, in its order
    out = {"case": case, "scenario": scen, "max_model_len": d["max_model_len"], **d["predicted"],
           "kernel_table": any("kernel table" in r for r in d.get("reasons", [])),
           "compilation_config": compilation}
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
    ap.add_argument("--gpu-perf", action="append", default=[], metavar="CASE=FILE",
                    help="plan CASE with the GPU figures `probe --measure` kept on its machine "
                         "(gpu-perf-CASE.json of tables after d0434d7), as its plans had them")
    ap.add_argument("--measured-gpu", action="store_true",
                    help="keep the --topology file's measured GPU and link figures, which no "
                         "machine's plan had (default: dropped, as the machine's NVML reading)")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    sys.path.insert(0, str(ROOT))
    import issue22_table  # the same directory

    source = args.predictions or args.results / "predictions.jsonl"
    old = [json.loads(x) for x in source.read_text().splitlines()]
    # each case's --gpu-memory-utilization and CUDA-graph range as issue22-table.sh served it
    # (scaled to the --topology GPU's memory as the script scaled it on that card)
    util = served_utils(args.topology)
    ranges = table_map("RANGE")
    jobs = [(d["case"], d["scenario"]) for d in old]
    args.out.mkdir(parents=True, exist_ok=True)
    topology = args.topology if args.measured_gpu else machine_topology(args.topology, args.out)
    topologies = {case: with_kept_perf(topology, Path(f).resolve(), args.out, case)
                  for case, _, f in (g.partition("=") for g in args.gpu_perf)}
    hosts = {case: host_timing_file(args.out, case, float(ratio))
             for case, _, ratio in (h.partition("=") for h in args.host_speed)}
    hosts.update({case: Path(f).resolve()
                  for case, _, f in (h.partition("=") for h in args.host_timing)})
    # the plans' own cache: the kernel tables kept for them, nothing of this host's
    cache = args.out / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir()
    if args.kernels:
        cache, names = kernel_cache(args.kernels, args.out)
        print(f"kernel tables of {', '.join(sorted(names))} -> {cache}")
    for case in {c for c, _ in jobs}:
        link = args.out / case
        if (args.results / case).is_dir() and not link.exists():
            link.symlink_to((args.results / case).resolve())
    # each plan at the request count its scenario's run measured
    per_stream: dict[tuple[str, str], int | None] = {}
    for case, scen in jobs:
        per_stream[case, scen], said = requests_per_stream(
            recorded_load(args.results, case, scen), scen)
        print(f"{case} {said}")
    with ThreadPoolExecutor(2) as pool:
        lines = list(pool.map(lambda j: plan_line(j[0], j[1], issue22_table.MODEL[j[0]],
                                                  util[j[0]], topologies.get(j[0], topology),
                                                  hosts.get(j[0]),
                                                  args.compilation_config
                                                  or ranges.get(j[0], RUNS_COMPILATION),
                                                  cache, per_stream[j]),
                                   jobs))
    (args.out / "predictions.jsonl").write_text("\n".join(lines) + "\n")
    print(f"{len(lines)} plans -> {args.out / 'predictions.jsonl'}")
    off = disagreements(old, [json.loads(x) for x in lines])
    print(f"against the machine's plans ({source.name}): " + (
        f"all {len(old)} the machine's, field for field" if not off else
        f"{len(off)} field(s) differ:\n  " + "\n  ".join(off)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
