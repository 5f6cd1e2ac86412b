"""How exactly loadgen measures, against a simulated engine whose timings are known.

    .venv/bin/python benchmarks/loadgen_accuracy.py [--quick] [--json FILE] [--no-vllm]
    .venv/bin/python benchmarks/loadgen_accuracy.py --peers [--setup-peers] [--peers-dir /tmp/peers]
        [--json F]

`--peers` puts the other tools beside loadgen in one run (see `peers()` below), on a stand-in
server that counts tokens with a real Hugging Face tokenizer (tests/loadgen/standin.py).
`--setup-peers` first makes or repairs, each in its own venv, a peer that is missing or cannot
run (`PEER_SETUP`: pinned versions; GuideLLM on torch 2.13.0, installed before it).

For each case, a fresh simulated engine (simengine.engine) sends token k of every request at
exactly t0 + TTFT + k·ITL. loadgen, then `vllm bench serve` (same shape, same simulator
settings), measure it; the table shows each tool's TTFT p50 and decode tok/s p50 against the
truth, the client CPU spent while requests were in flight (sampled from /proc, the same way for
both tools), and the simulator's own lateness (its late_sum / tokens), which is part of any
error either tool shows.

Shape: 1 stream is a closed loop; 64 and 256 streams arrive at a constant rate C / e2e with at
most C in flight, so C streams run at once without all starting in the same millisecond (a
synchronized burst of 256 requests queues in any server's parser, which is then not the TTFT
the simulator was asked for). Bounds (issue 5): TTFT p50 within 2 % or 1 ms, decode within 1 %.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from simengine.engine import SimConfig, spawn  # noqa: E402

PROMPT, GEN = 512, 256
TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Case:
    streams: int
    ttft: float
    itl: float
    requests: int

    @property
    def e2e(self) -> float:
        return self.ttft + (GEN - 1) * self.itl

    @property
    def rate(self) -> float | None:
        return None if self.streams == 1 else self.streams / self.e2e

    @property
    def token_rate(self) -> float:
        return self.streams / self.itl


@dataclass(frozen=True)
class Measured:
    tool: str
    case: Case
    ttft_p50_s: float | None
    decode_p50: float | None
    itl_p50_s: float | None
    itl_p99_s: float | None
    ok: int
    failed: int
    client_cpu_s: float  # CPU of the client process while requests were in flight
    busy_s: float  # wall time requests were in flight
    sim_late_per_token_s: float
    sim_late_max_s: float
    # loadgen only: p50 of (first token − response headers); the simulator sends its headers at
    # t0, so this is its TTFT with the time a request waited in its socket taken out.
    after_headers_p50_s: float | None = None

    @property
    def ttft_err(self) -> float | None:
        return None if self.ttft_p50_s is None else self.ttft_p50_s - self.case.ttft

    @property
    def decode_err(self) -> float | None:
        truth = 1 / self.case.itl
        return None if self.decode_p50 is None else (self.decode_p50 - truth) / truth

    @property
    def within_bounds(self) -> bool:
        t, d = self.ttft_err, self.decode_err
        return (
            t is not None
            and d is not None
            and abs(t) <= max(0.02 * self.case.ttft, 0.001)
            and abs(d) <= 0.01
        )

    @property
    def cpu_us_per_token(self) -> float:
        tokens = self.ok * GEN
        return self.client_cpu_s / tokens * 1e6 if tokens else float("nan")


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.load(resp)


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


class Sampler(threading.Thread):
    """CPU of `pid` at the first and last moment the simulator had requests running."""

    def __init__(self, pid: int, sim: str) -> None:
        super().__init__(daemon=True)
        self.pid, self.sim = pid, sim
        self.first: tuple[float, float] | None = None
        self.last: tuple[float, float] | None = None
        self.stop = False

    def run(self) -> None:
        while not self.stop:
            try:
                running = _get(f"{self.sim}/sim/stats")["running"]
                sample = (time.monotonic(), _cpu_s(self.pid))
            except (OSError, ValueError, IndexError):
                break
            if running:
                self.first = self.first or sample
                self.last = sample
            time.sleep(0.05)

    def cpu_and_busy(self) -> tuple[float, float]:
        if not self.first or not self.last:
            return 0.0, 0.0
        return self.last[1] - self.first[1], self.last[0] - self.first[0]


def _run_client(argv: list[str], sim: str) -> tuple[float, float]:
    proc = subprocess.Popen(
        argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    sampler = Sampler(proc.pid, sim)
    sampler.start()
    _, err = proc.communicate(timeout=900)
    sampler.stop = True
    sampler.join()
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"{argv[1:3]} exited {proc.returncode}: {err[-2000:]}")
    return sampler.cpu_and_busy()


def _sim_lateness(sim: str) -> tuple[float, float]:
    stats = _get(f"{sim}/sim/stats")
    tokens = max(1, stats["generation_tokens"])
    return stats["late_sum_s"] / tokens, stats["late_max_s"]


def run_loadgen(case: Case, sim: str, out: Path) -> Measured:
    argv = [
        sys.executable,
        "-m",
        "loadgen",
        "--url",
        sim,
        "--prompt",
        str(PROMPT),
        "--gen",
        str(GEN),
        "--concurrency",
        str(case.streams),
        "--requests",
        str(case.requests),
        "--json",
        str(out),
        "--no-progress",
    ]
    if case.rate:
        argv += ["--rate", f"{case.rate:.6f}", "--arrivals", "constant"]
    cpu, busy = _run_client(argv, sim)
    data = json.loads(out.read_text())
    s = data["summary"]
    late, late_max = _sim_lateness(sim)
    after = sorted(
        r["ttft_s"] - r["headers_s"] for r in data["requests"] if r["ttft_s"] and r["headers_s"]
    )
    return Measured(
        "loadgen",
        case,
        s["ttft_s"]["p50"],
        s["decode_tok_s"]["p50"],
        s["itl_s"]["p50"],
        s["itl_s"]["p99"],
        s["requests_ok"],
        s["requests_failed"],
        cpu,
        busy,
        late,
        late_max,
        after[len(after) // 2] if after else None,
    )


def run_vllm(case: Case, sim: str, tokenizer: str, out: Path) -> Measured:
    argv = [
        sys.executable,
        str(REPO / "benchmarks" / "vllm_bench_serve.py"),
        "--backend",
        "openai",
        "--base-url",
        sim,
        "--endpoint",
        "/v1/completions",
        "--model",
        "sim-model",
        "--tokenizer",
        tokenizer,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(PROMPT),
        "--random-output-len",
        str(GEN),
        "--num-prompts",
        str(case.requests),
        "--max-concurrency",
        str(case.streams),
        "--ignore-eos",
        "--save-result",
        "--result-dir",
        str(out.parent),
        "--result-filename",
        out.name,
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,90,99",
        "--disable-tqdm",
    ]
    if case.rate:
        argv += ["--request-rate", f"{case.rate:.6f}", "--burstiness", "1000"]
    cpu, busy = _run_client(argv, sim)
    r = json.loads(out.read_text())
    tpot = r.get("median_tpot_ms")
    late, late_max = _sim_lateness(sim)
    return Measured(
        "vllm bench serve",
        case,
        r["median_ttft_ms"] / 1000,
        1000 / tpot if tpot else None,
        r["median_itl_ms"] / 1000,
        r["p99_itl_ms"] / 1000,
        r["completed"],
        r["failed"],
        cpu,
        busy,
        late,
        late_max,
    )


def _fmt(m: Measured) -> str:
    a = m.after_headers_p50_s
    t = m.ttft_err
    d = m.decode_err
    return (
        f"| {m.case.streams} | {m.case.itl * 1000:g} | {m.case.token_rate:,.0f} | {m.tool} |"
        f" {m.ok}/{m.failed} |"
        f" {'-' if m.ttft_p50_s is None else f'{m.ttft_p50_s * 1000:.2f}'}"
        f" ({'-' if t is None else f'{t * 1000:+.2f} ms'}) |"
        f" {'-' if m.decode_p50 is None else f'{m.decode_p50:.3f}'}"
        f" ({'-' if d is None else f'{d * 100:+.2f} %'}) |"
        f" {'-' if m.itl_p99_s is None else f'{m.itl_p99_s * 1000:.1f}'} |"
        f" {m.client_cpu_s:.2f} s / {m.busy_s:.1f} s = {m.client_cpu_s / max(m.busy_s, 1e-9):.0%} |"
        f" {m.cpu_us_per_token:.1f} |"
        f" {m.sim_late_per_token_s * 1000:.2f} / {m.sim_late_max_s * 1000:.1f} |"
        f" {'yes' if m.within_bounds else 'NO'} |"
        f" {'-' if a is None else f'{a * 1000:.2f} ({(a - m.case.ttft) * 1000:+.2f} ms)'} |"
    )


HEADER = (
    "| streams | ITL ms | true tok/s | tool | ok/failed | TTFT p50 ms (error) |"
    " decode tok/s p50 (error) | ITL p99 ms | client CPU in flight | CPU µs/token |"
    " sim late ms mean/max | within bounds | TTFT after headers p50 ms |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def cases(quick: bool) -> list[Case]:
    scale = 1 if quick else 2
    accuracy = [
        Case(1, 0.08, 0.012, 4 if quick else 10),
        Case(64, 0.08, 0.012, 64 * scale),
        Case(256, 0.08, 0.012, 256 * scale),
    ]
    capacity = [Case(256, 0.08, itl, 256 * scale) for itl in (0.006, 0.003)]
    return accuracy + ([] if quick else capacity)


# ---- peers: the same cases measured by loadgen and the other tools, side by side ---------------
#
# Each tool lives in its own virtual environment under --peers-dir (pip-installed there, not into
# .venv: they would move its torch/vLLM pins); `vllm bench serve` comes from .venv's vLLM. A tool
# that is not installed, or cannot run, gets a line saying why instead of a row. Every row has a
# fresh stand-in server (tests/loadgen/standin.py): prompts counted with the embedded model's
# tokenizer (so `prompt exact` is what a real server would say), token k of each request due at
# t0 + TTFT + k·ITL, sent K tokens per event, and without ignore_eos a request stops after 16
# tokens, as a model that says EOS would. All tools get that tokenizer and ask for 512 prompt
# tokens and 128 output tokens; at 32 streams every tool starts all 32 at once (a burst).

PEER_PROMPT, PEER_GEN, PEER_TTFT, PEER_ITL = 512, 128, 0.08, 0.01


@dataclass(frozen=True)
class PeerCase:
    streams: int
    per_event: int  # tokens per streamed event
    requests: int
    usage: bool = True  # the server sends usage (prompt and completion counts)

    @property
    def true_ttft(self) -> float:
        """The first event leaves with its last token: TTFT + (K − 1)·ITL."""
        return PEER_TTFT + (self.per_event - 1) * PEER_ITL


@dataclass
class PeerRow:
    tool: str
    case: PeerCase
    ok: int = 0
    failed: int = 0
    ttft_p50_s: float | None = None
    itl_p50_s: float | None = None
    reported_out: float | None = None  # output tokens the tool says it got, all requests
    sent_out: int = 0  # output tokens the server sent, all requests
    prompt_exact: int = 0  # requests whose prompt the server counted as PEER_PROMPT tokens
    out_exact: int = 0  # requests the server answered with PEER_GEN tokens
    seen: int = 0  # requests the server saw
    cpu_s: float = 0.0  # the tool's whole process tree, start-up included
    wall_s: float = 0.0
    sim_late_s: float = 0.0
    note: str = ""


def peer_cases(quick: bool) -> list[PeerCase]:
    n = 1 if quick else 2
    return [
        PeerCase(1, 1, 4 * n),
        PeerCase(32, 1, 32 * n),
        PeerCase(32, 2, 32 * n),
        PeerCase(32, 2, 32 * n, usage=False),  # counts must come from the client's tokenizer
    ]


def _timed(
    argv: list[str], cwd: Path, log: Path, env: dict[str, str] | None = None
) -> tuple[int, float, float]:
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    with log.open("w") as out:
        code = subprocess.run(
            argv,
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=900,
            check=False,
            env={**os.environ, **(env or {})},
        ).returncode
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return code, cpu, wall


def _tail(log: Path) -> str:
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    return (lines[-1] if lines else "(no output)")[:200]


def peer_loadgen(case: PeerCase, url: str, tok: str, work: Path, row: PeerRow) -> None:
    out = work / "loadgen.json"
    argv = [sys.executable, "-m", "loadgen", "--url", url, "--tokenizer", tok,
            "--prompt", str(PEER_PROMPT), "--gen", str(PEER_GEN), "--concurrency",
            str(case.streams), "--requests", str(case.requests), "--json", str(out),
            "--no-progress"]  # fmt: skip
    code, row.cpu_s, row.wall_s = _timed(argv, REPO, work / "loadgen.log")
    if not out.exists():
        row.note = f"exit {code}: {_tail(work / 'loadgen.log')}"
        return
    d = json.loads(out.read_text())
    s = d["summary"]
    row.ok, row.failed = s["requests_ok"], s["requests_failed"]
    row.ttft_p50_s, row.itl_p50_s = s["ttft_s"]["p50"], s["itl_s"]["p50"]
    row.reported_out = sum(r["completion_tokens"] or 0 for r in d["requests"])


def peer_vllm(case: PeerCase, url: str, tok: str, work: Path, row: PeerRow) -> None:
    out = work / "vllm.json"
    argv = [sys.executable, str(REPO / "benchmarks" / "vllm_bench_serve.py"), "--backend",
            "openai", "--base-url", url, "--endpoint", "/v1/completions", "--model",
            "standin-model", "--tokenizer", tok, "--dataset-name", "random",
            "--random-input-len", str(PEER_PROMPT), "--random-output-len", str(PEER_GEN),
            "--num-prompts", str(case.requests), "--max-concurrency", str(case.streams),
            "--ignore-eos", "--save-result", "--result-dir", str(work), "--result-filename",
            out.name, "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles",
            "50,90,99", "--disable-tqdm"]  # fmt: skip
    code, row.cpu_s, row.wall_s = _timed(argv, REPO, work / "vllm.log")
    if not out.exists():
        row.note = f"exit {code}: {_tail(work / 'vllm.log')}"
        return
    r = json.loads(out.read_text())
    row.ok, row.failed = r["completed"], r.get("failed", 0)
    row.ttft_p50_s, row.itl_p50_s = r["median_ttft_ms"] / 1000, r["median_itl_ms"] / 1000
    row.reported_out = r["total_output_tokens"]


def peer_aiperf(case: PeerCase, url: str, tok: str, work: Path, row: PeerRow, exe: Path) -> None:
    art = work / "aiperf"
    argv = [str(exe), "profile", "--model", "standin-model", "--url", url, "--endpoint-type",
            "completions", "--streaming", "--tokenizer", tok, "--synthetic-input-tokens-mean",
            str(PEER_PROMPT), "--synthetic-input-tokens-stddev", "0", "--output-tokens-mean",
            str(PEER_GEN), "--output-tokens-stddev", "0", "--extra-inputs", "ignore_eos:true",
            "--extra-inputs", f"min_tokens:{PEER_GEN}", "--concurrency", str(case.streams),
            "--request-count", str(case.requests), "--output-artifact-dir", str(art),
            "--ui-type", "none"]  # fmt: skip
    code, row.cpu_s, row.wall_s = _timed(argv, work, work / "aiperf.log")
    found = art / "profile_export_aiperf.json"
    if not found.exists():
        row.note = f"exit {code}: {_tail(work / 'aiperf.log')}"
        return
    d = json.loads(found.read_text())
    row.ok = int(d["request_count"]["avg"])
    row.failed = sum(int(e.get("count", 0)) for e in d.get("error_summary") or [])
    row.ttft_p50_s = d["time_to_first_token"]["p50"] / 1000
    row.itl_p50_s = d["inter_token_latency"]["p50"] / 1000
    row.reported_out = d["output_token_count"]["sum"]


def peer_inference_perf(
    case: PeerCase, url: str, tok: str, work: Path, row: PeerRow, exe: Path
) -> None:
    store = work / "ip"
    n = case.requests
    dist = "{{min: {v}, max: {v}, mean: {v}, std_dev: 0, total_count: {n}}}"
    config = "\n".join([
        "load:", "  type: concurrent", "  stages:",
        f"  - concurrency_level: {case.streams}", f"    num_requests: {n}",
        "api:", "  type: completion", "  streaming: true",
        "server:", "  type: vllm", "  model_name: standin-model", f"  base_url: {url}",
        "  ignore_eos: true",
        "tokenizer:", f"  pretrained_model_name_or_path: {tok}",
        "data:", "  type: random",
        f"  input_distribution: {dist.format(v=PEER_PROMPT, n=n)}",
        f"  output_distribution: {dist.format(v=PEER_GEN, n=n)}",
        "report:", "  request_lifecycle: {summary: true, per_request: false}",
        "storage:", f"  local_storage: {{path: {store}}}", "",
    ])  # fmt: skip
    (work / "ip.yaml").write_text(config)
    code, row.cpu_s, row.wall_s = _timed([str(exe), "-c", str(work / "ip.yaml")], work,
                                         work / "ip.log")  # fmt: skip
    found = store / "summary_lifecycle_metrics.json"
    if not found.exists():
        row.note = f"exit {code}: {_tail(work / 'ip.log')}"
        return
    d = json.loads(found.read_text())
    ok = d["successes"]
    lat = ok["latency"]
    row.ok = ok["count"]
    row.failed = (d.get("failures") or {}).get("count", 0)
    row.ttft_p50_s = lat["time_to_first_token"]["median"]
    row.itl_p50_s = lat["inter_token_latency"]["median"]
    # output_len is the client's own re-tokenized count (mean per request); output_tokens the
    # server's usage. The table shows the client's own, as for the other tools.
    mean = (ok.get("output_len") or {}).get("mean")
    row.reported_out = mean * row.ok if mean is not None else None


def peer_guidellm(case: PeerCase, url: str, tok: str, work: Path, row: PeerRow, exe: Path) -> None:
    out = work / "guidellm.json"
    # A scenario file rather than flags: its `kind=...,key=value` flags cannot carry a nested
    # body. No health check (the stand-in, like a hosted API, has no /health); all streams start
    # at once (no ramp-up), no warm-up or cool-down is cut from the figures.
    spec = {"spec": {
        "backend": {"kind": "openai_http", "target": url, "model": "standin-model",
                    "request_format": "/v1/completions", "validate_backend": False,
                    "extras": {"body": {"ignore_eos": True}}},
        "profile": {"kind": "concurrent", "streams": [case.streams]},
        "constraints": [{"kind": "max_requests", "count": case.requests}],
        "tokenizer": {"kind": "huggingface_auto", "model": tok},
        "data": [{"kind": "synthetic_text", "prompt_tokens": PEER_PROMPT,
                  "output_tokens": PEER_GEN}],
        "outputs": [{"kind": "json", "path": str(out)}],
    }}  # fmt: skip
    (work / "guidellm-scenario.json").write_text(json.dumps(spec))
    argv = [str(exe), "run", "-c", str(work / "guidellm-scenario.json"),
            "--disable-console-interactive"]  # fmt: skip
    code, row.cpu_s, row.wall_s = _timed(argv, work, work / "guidellm.log")
    if not out.exists():
        row.note = f"exit {code}: {_tail(work / 'guidellm.log')}"
        return
    m = json.loads(out.read_text())["benchmarks"][0]["metrics"]
    totals = m["request_totals"]
    row.ok, row.failed = totals["successful"], totals["errored"] + totals["incomplete"]
    row.ttft_p50_s = m["time_to_first_token_ms"]["successful"]["median"] / 1000
    row.itl_p50_s = m["inter_token_latency_ms"]["successful"]["median"] / 1000
    row.reported_out = m["output_token_count"]["successful"]["total_sum"]


# Each peer's venv: the Python it needs, then pip installs in order, then a check that it can run.
# GuideLLM depends on a bare `torch`: installing torch==2.13.0 first makes pip take the CPU wheel
# this machine keeps on disk (/opt/wheels), which then satisfies guidellm's requirement; left to
# resolve it alone, pip would pull PyPI's CUDA build (GBs). Where no such wheel is on disk, the
# same pin downloads PyPI's build of that release.
PEER_SETUP: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "aiperf": ("python3.11", ("aiperf==0.13.0",), ("aiperf", "--version")),
    "inference-perf": ("python3.12", ("inference-perf==0.7.0",), ("inference-perf", "--help")),
    "guidellm": (
        "python3.11",
        ("torch==2.13.0", "guidellm==0.8.1"),
        ("python", "-c", "import torch, guidellm.data, guidellm.benchmark"),
    ),
}
PEER_RUNNERS: dict[str, tuple[str, Any]] = {
    "aiperf": ("aiperf", peer_aiperf),
    "inference-perf": ("inference-perf", peer_inference_perf),
    "guidellm": ("guidellm", peer_guidellm),
}


def _setup_commands(name: str, venv: Path) -> list[str]:
    python, installs, _ = PEER_SETUP[name]
    return [f"{python} -m venv {venv}", *(f"{venv}/bin/pip install {p}" for p in installs)]


def _peer_broken(name: str, venv: Path) -> str | None:
    """Why the peer in `venv` cannot run, or None if its own check passes."""
    _, _, check = PEER_SETUP[name]
    exe = venv / "bin" / check[0]
    if not exe.exists():
        return f"not installed at {exe}"
    try:
        probe = subprocess.run([str(exe), *check[1:]], capture_output=True, text=True,
                               timeout=300, check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        return f"`{' '.join(check)}` did not finish in 300 s"
    if probe.returncode == 0:
        return None
    last = (probe.stderr.strip() or probe.stdout.strip() or "?").splitlines()[-1]
    return f"installed but broken: `{' '.join(check)}` exited {probe.returncode}: {last[:200]}"


def _setup_peer(name: str, venv: Path) -> str | None:
    """Make (or repair) the peer's venv with its pinned installs; why not, or None."""
    print(f"{name}: setting up {venv}", flush=True)
    log = venv.parent / f"{name}.setup.log"
    venv.parent.mkdir(parents=True, exist_ok=True)
    cmds = _setup_commands(name, venv)
    if (venv / "bin" / "python").exists():
        cmds = cmds[1:]  # repair in place: keep what is installed, add what is missing
    with log.open("w") as out:
        for cmd in cmds:
            try:
                code = subprocess.run(cmd.split(), stdout=out, stderr=subprocess.STDOUT,
                                      timeout=1800, check=False).returncode  # fmt: skip
            except (OSError, subprocess.TimeoutExpired) as e:
                return f"`{cmd}` failed: {e}"
            if code:
                return f"`{cmd}` exited {code} (log: {log})"
    return None


PEER_HEADER = (
    "| streams | tokens/event, usage | tool | ok/failed | prompt exact (server count) |"
    " output exact (server sent) | output tokens reported / sent | TTFT p50 ms (error vs"
    " 80 ms + (K-1)·10 ms) |"
    " ITL p50 ms (truth 10) | client CPU s (whole tree, start-up incl.) / wall s |"
    " sim late ms/token |\n|---|---|---|---|---|---|---|---|---|---|---|"
)


def _peer_fmt(r: PeerRow) -> str:
    c = r.case
    if r.note:
        return (
            f"| {c.streams} | {c.per_event}, {'yes' if c.usage else 'no'} | {r.tool} | - | - | - |"
            f" - | - | - | - | {r.note} |"
        )
    ttft = (
        "-"
        if r.ttft_p50_s is None
        else (f"{r.ttft_p50_s * 1000:.1f} ({(r.ttft_p50_s - c.true_ttft) * 1000:+.1f})")
    )
    itl = "-" if r.itl_p50_s is None else f"{r.itl_p50_s * 1000:.2f}"
    ratio = "-" if not r.reported_out or not r.sent_out else f"{r.reported_out / r.sent_out:.2f}"
    return (
        f"| {c.streams} | {c.per_event}, {'yes' if c.usage else 'no'} | {r.tool} |"
        f" {r.ok}/{r.failed} |"
        f" {r.prompt_exact}/{r.seen} | {r.out_exact}/{r.seen} |"
        f" {r.reported_out or '-'} / {r.sent_out} = {ratio} | {ttft} | {itl} |"
        f" {r.cpu_s:.1f} / {r.wall_s:.1f} | {r.sim_late_s * 1000:.2f} |"
    )  # fmt: skip


def peers(quick: bool, peers_dir: Path, json_path: Path | None, setup: bool = False) -> None:
    sys.path.insert(0, str(REPO))
    from launcher.model.tinymodel import ensure_tiny_model
    from tests.loadgen.standin import spawn as spawn_standin

    tok = str(ensure_tiny_model())
    tools: list[tuple[str, Any]] = [("loadgen", peer_loadgen), ("vllm bench serve", peer_vllm)]
    for name, (exe_name, fn) in PEER_RUNNERS.items():
        venv = peers_dir / name
        why = _peer_broken(name, venv)
        if why and setup:
            why = _setup_peer(name, venv) or _peer_broken(name, venv)
        if why:
            print(f"{name}: skipped, {why} (set up with --setup-peers, or by hand:"
                  f" {' && '.join(_setup_commands(name, venv))})", flush=True)  # fmt: skip
            continue
        exe = venv / "bin" / exe_name
        tools.append((name, lambda c, u, t, w, r, fn=fn, exe=exe: fn(c, u, t, w, r, exe)))
    print(
        f"run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())},"
        f" load average before {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores",
        flush=True,
    )
    print(PEER_HEADER, flush=True)
    rows: list[PeerRow] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, case in enumerate(peer_cases(quick)):
            for name, fn in tools:
                args = ("--tokenizer", tok, "--ttft", str(PEER_TTFT), "--itl", str(PEER_ITL),
                        "--tokens-per-chunk", str(case.per_event), "--eos-after", "16",
                        "--max-model-len", "8192",
                        *([] if case.usage else ["--no-usage"]))  # fmt: skip
                work = Path(tmp) / f"{i}-{name.replace(' ', '_')}"
                work.mkdir()
                row = PeerRow(name, case)
                with spawn_standin(*args) as url:
                    fn(case, url, tok, work, row)
                    stats = _get(f"{url}/sim/stats")
                seen = stats["requests"]
                row.seen = len(seen)
                row.prompt_exact = sum(r["prompt_tokens"] == PEER_PROMPT for r in seen)
                row.out_exact = sum(r["completion_tokens"] == PEER_GEN for r in seen)
                row.sent_out = stats["tokens"]
                row.sim_late_s = stats["late_sum_s"] / max(1, stats["tokens"])
                rows.append(row)
                print(_peer_fmt(row), flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}", flush=True)
    if json_path:
        json_path.write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="fewer requests, no capacity sweep")
    p.add_argument("--no-vllm", action="store_true", help="skip `vllm bench serve`")
    p.add_argument("--json", type=Path, help="write every measurement here")
    p.add_argument("--peers", action="store_true", help="loadgen beside the other tools")
    p.add_argument(
        "--peers-dir",
        type=Path,
        default=Path("/tmp/peers"),
        help="where each peer has its venv: DIR/aiperf, DIR/inference-perf, DIR/guidellm",
    )
    p.add_argument(
        "--setup-peers",
        action="store_true",
        help="with --peers: make or repair a peer's venv that is missing or cannot run"
        " (pinned: aiperf 0.13.0, inference-perf 0.7.0, guidellm 0.8.1 on torch 2.13.0)",
    )
    p.add_argument("--render", type=Path, help="print the peer table of a saved --peers --json")
    args = p.parse_args()
    if args.render:
        print(PEER_HEADER)
        for saved in json.loads(args.render.read_text()):
            saved["case"] = PeerCase(**saved["case"])
            print(_peer_fmt(PeerRow(**saved)))
        return
    if args.peers:
        peers(args.quick, args.peers_dir, args.json, args.setup_peers)
        return
    tokenizer = ""
    if not args.no_vllm:
        from launcher.model.tinymodel import ensure_tiny_model

        tokenizer = str(ensure_tiny_model())  # vllm bench needs a local tokenizer for prompts
    results: list[Measured] = []
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
    print(HEADER, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for i, case in enumerate(cases(args.quick)):
            for name in ["loadgen"] + ([] if args.no_vllm else ["vllm"]):
                with spawn(
                    SimConfig(
                        port=0, ttft=case.ttft, itl=case.itl, model="sim-model", max_model_len=8192
                    )
                ) as sim:
                    out = Path(tmp) / f"{name}-{i}.json"
                    m = (
                        run_loadgen(case, sim, out)
                        if name == "loadgen"
                        else run_vllm(case, sim, tokenizer, out)
                    )
                results.append(m)
                print(_fmt(m), flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}", flush=True)
    if args.json:
        args.json.write_text(
            json.dumps(
                [
                    {
                        **asdict(m),
                        "ttft_err_s": m.ttft_err,
                        "decode_err": m.decode_err,
                        "within_bounds": m.within_bounds,
                        "cpu_us_per_token": m.cpu_us_per_token,
                    }
                    for m in results
                ],
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
