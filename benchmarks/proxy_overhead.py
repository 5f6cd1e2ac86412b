"""What the proxy adds: the same load direct to the simulated engine and through the proxy.

    .venv/bin/python benchmarks/proxy_overhead.py [--ttft 0.05] [--itl 0.02] [--tokens 64]
        [--levels 1,64,256] [--rounds 3] [--sequential 20] [--json FILE]
        [--proxy-cmd 'python other/proxy.py --upstream {upstream} --port {port}']
        [--peers nginx,vllm-router] [--route /v1/completions|/v1/chat/completions|/v1/messages]
        [--prompt-ids 512] [--proxy NAME='CMD' ...]

Starts a simulated engine (TTFT 50 ms, then a token every 20 ms: a 70B model's pace) and the
proxy in front of it, each in its own process, then for every concurrency level runs the
same burst direct and proxied, ``--rounds`` times, and prints medians side by side with ratios.
Level 1 is ``--sequential`` requests one after another. Throughput is generated tokens over the
wall time of the burst; TTFT is the client's, from request sent to the first token event. The
client is a lean raw-asyncio one (simengine.client) on uvloop.

The rounds are paired: each round runs both paths back to back, in alternating order (so
neither always runs second, on a warmer or busier machine), and the verdict is the median of
the per-round differences, with their interquartile range: on these shared machines a burst's
TTFT p50 moves by several ms from one second to the next, and a pair shares most of that.
``--proxy-cmd`` measures another proxy build (e.g. an older checkout) against the same engine;
``--proxy NAME=CMD`` (repeatable) puts further builds beside it in the same run, each in
every position over the rounds, so that two builds compare on the same rounds (the issue-25
measurements: today's HTTP layers against well-kept libraries, and the starting commit).

``--prompt-ids N`` sends a prompt of N token ids (``"prompt": [ids]``, /v1/completions only)
instead of the two-word prompt: a request body of a few KiB, as a client with its own tokenizer
sends, whose parsing and checking the short prompt does not show.

``--peers`` puts other proxies beside toposerve in the same run, in front of the same engine,
each round running every path in a rotated order: ``nginx`` (Debian's, one worker process,
upstream keep-alive, buffering off) and ``vllm-router`` (vLLM's Rust router from PyPI, round
robin over the one engine). A peer whose program is not found is skipped with a line saying so
(``--vllm-router PATH`` / ``--nginx PATH`` point at one elsewhere).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from simengine.client import StreamResult, percentile, stream
from simengine.engine import SimConfig, spawn, stop_process


@dataclass(frozen=True)
class Round:
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_mean_ms: float
    tok_per_s: float
    errors: int


def summarize(results: list[StreamResult], wall_s: float) -> Round:
    ok = [r for r in results if r.error is None and r.token_times]
    ttfts = [r.ttft * 1000 for r in ok if r.ttft is not None]
    itls = [g * 1000 for r in ok for g in r.itls]
    tokens = sum(len(r.token_times) for r in ok)
    return Round(
        ttft_p50_ms=percentile(ttfts, 50), ttft_p99_ms=percentile(ttfts, 99),
        itl_mean_ms=statistics.fmean(itls) if itls else float("nan"),
        tok_per_s=tokens / wall_s if wall_s > 0 else 0.0,
        errors=len(results) - len(ok))


ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/messages")


async def burst(url: str, concurrency: int, tokens: int, sequential: int,
                route: str = "/v1/completions", prompt_ids: int = 0) -> Round:
    body: dict[str, object] = {"model": "sim-model", "max_tokens": tokens, "ignore_eos": True,
                               "stream": True}
    if route == "/v1/completions":
        # ids spread over a vocabulary, so their JSON is as long as a real tokenizer's
        body["prompt"] = ([(i * 7919) % 50000 + 100 for i in range(prompt_ids)] if prompt_ids
                          else "benchmark prompt")
    else:
        body["messages"] = [{"role": "user", "content": "benchmark prompt"}]
    target = url + route
    t0 = time.perf_counter()
    if concurrency == 1:
        results = [await stream(target, body) for _ in range(sequential)]
    else:
        results = list(await asyncio.gather(*(stream(target, body) for _ in range(concurrency))))
    return summarize(results, time.perf_counter() - t0)


@dataclass(frozen=True)
class Paired:
    """Per-round proxied-minus-direct TTFT p50 (ms) and proxied/direct throughput."""

    added_ms: list[float]
    ratios: list[float]

    def added(self, q: float = 50) -> float:
        return percentile(self.added_ms, q)

    def ratio(self, q: float = 50) -> float:
        return percentile(self.ratios, q)


def paired(direct: list[Round], proxied: list[Round]) -> Paired:
    return Paired([p.ttft_p50_ms - d.ttft_p50_ms for d, p in zip(direct, proxied, strict=True)],
                  [p.tok_per_s / d.tok_per_s if d.tok_per_s else float("nan")
                   for d, p in zip(direct, proxied, strict=True)])


def median_round(rounds: list[Round]) -> Round:
    def med(attr: str) -> float:
        return float(statistics.median(getattr(r, attr) for r in rounds))

    return Round(med("ttft_p50_ms"), med("ttft_p99_ms"), med("itl_mean_ms"), med("tok_per_s"),
                 sum(r.errors for r in rounds))


@contextmanager
def proxy_process(upstream: str, port: int,
                  command: str | None = None) -> Iterator[tuple[str, int]]:
    """Run ``python -m server`` (or ``command``, with {upstream} and {port} filled in) in front
    of ``upstream``; yields its URL and pid."""
    # The simulated engine keeps idle connections open, as nginx's upstream pool (60 s) and
    # vllm-router's client reuse them: the proxy is told so, else it would open every engine
    # connection again in each burst (its default is vLLM's 5 s; docs/benchmarks-proxy.md).
    argv = [sys.executable, "-m", "server", "--upstream", upstream, "--port", str(port),
            "--log-level", "warning", "--upstream-keep-alive", "60"]
    if command:
        argv = shlex.split(command.format(upstream=upstream, port=port))
    with _running(argv, f"http://127.0.0.1:{port}", "/ready", "the proxy") as running:
        yield running


@contextmanager
def _running(argv: list[str], url: str, ready_path: str, what: str,
             log: Path | None = None) -> Iterator[tuple[str, int]]:
    out = log.open("wb") if log is not None else None
    proc = subprocess.Popen(argv, env={**os.environ, "TOPOSERVE_API_KEYS": ""}, stdout=out,
                            stderr=subprocess.STDOUT if out else None)
    try:
        _wait_ready(url + ready_path, proc, what)
        yield url, proc.pid
    finally:
        stop_process(proc, 10)
        if out is not None:
            out.close()


def _wait_ready(url: str, proc: subprocess.Popen[bytes], what: str = "the proxy") -> None:
    import urllib.request

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"{what} did not become ready in 30 s")


NGINX_CONF = """worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    upstream engine {{ server {engine}; keepalive 1024; }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location / {{
            proxy_pass http://engine;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 600s;
        }}
    }}
}}
"""


def find_program(name: str, given: str | None) -> str | None:
    """``given``, else ``name`` on PATH, beside this interpreter, or in /usr/sbin."""
    if given:
        return given if Path(given).exists() else None
    for where in (None, str(Path(sys.executable).parent), "/usr/sbin"):
        found = shutil.which(name, path=where)
        if found:
            return found
    return None


@contextmanager
def peer_process(name: str, program: str, upstream: str,
                 tmp: Path) -> Iterator[tuple[str, int]]:
    """A peer proxy in front of ``upstream``; yields its URL and pid."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    engine = upstream.removeprefix("http://")
    if name == "nginx":
        conf = tmp / "nginx.conf"
        conf.write_text(NGINX_CONF.format(tmp=tmp, engine=engine, port=port))
        argv = [program, "-c", str(conf), "-p", str(tmp), "-e", str(tmp / "error.log")]
    else:
        argv = [program, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", upstream,
                "--policy", "round_robin", "--log-level", "warning",
                "--log-dir", str(tmp / "router-logs")]
    # Ready once it relays: the engine's /health through it.
    with _running(argv, url, "/health", name, log=tmp / f"{name}.log") as running:
        yield running


PEERS = ("nginx", "vllm-router")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ttft", type=float, default=0.05)
    p.add_argument("--itl", type=float, default=0.02)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--levels", default="1,64,256")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sequential", type=int, default=20)
    p.add_argument("--proxy-url", help="measure this running proxy instead of starting one")
    p.add_argument("--proxy-cmd", help="start this command as the proxy ({upstream}, {port})")
    p.add_argument("--peers", default="",
                   help=f"other proxies in the same run, comma-separated: {', '.join(PEERS)}")
    p.add_argument("--nginx", help="the nginx program (default: found on PATH or /usr/sbin)")
    p.add_argument("--vllm-router", help="the vllm-router program (default: on PATH)")
    p.add_argument("--route", choices=ROUTES, default="/v1/completions",
                   help="what the streams ask for (default: the lean /v1/completions)")
    p.add_argument("--prompt-ids", type=int, default=0,
                   help="send a prompt of this many token ids (/v1/completions)")
    p.add_argument("--proxy", action="append", default=[], metavar="NAME=CMD",
                   help="a further proxy in the same run ({upstream}, {port}); repeatable")
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    if a.prompt_ids and a.route != "/v1/completions":
        p.error("--prompt-ids goes with --route /v1/completions")
    extra = [x.partition("=")[::2] for x in a.proxy]
    if any(not name or not cmd or name in ("direct", "proxied", *PEERS) for name, cmd in extra):
        p.error("--proxy takes NAME=CMD, NAME not direct, proxied or a peer's")
    import uvloop

    levels = [int(x) for x in a.levels.split(",")]
    peers = [x.strip() for x in a.peers.split(",") if x.strip()]
    unknown = [x for x in peers if x not in PEERS]
    if unknown:
        p.error(f"unknown peer {unknown[0]!r}: choose from {', '.join(PEERS)}")
    report: dict[str, dict[str, object]] = {}
    with ExitStack() as stack:
        sim = stack.enter_context(spawn(SimConfig(ttft=a.ttft, itl=a.itl, max_model_len=1 << 20)))
        proxy = a.proxy_url or stack.enter_context(
            proxy_process(sim, free_port(), a.proxy_cmd))[0]
        paths = [("direct", sim), ("proxied", proxy)]
        for name, cmd in extra:
            paths.append((name, stack.enter_context(proxy_process(sim, free_port(), cmd))[0]))
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="peers-")))
        for name in peers:
            program = find_program(name, getattr(a, name.replace("-", "_")))
            if program is None:
                print(f"peer {name}: skipped ({name} not found; "
                      + ("Debian: apt-get install nginx-light" if name == "nginx" else
                         "PyPI: pip install vllm-router") + ")")
                continue
            (tmp / name).mkdir()
            paths.append((name, stack.enter_context(peer_process(name, program, sim,
                                                                 tmp / name))[0]))
        # Warm each proxy's keep-alive pool to the largest level: a running proxy has its pool.
        for _, url in paths[1:]:
            uvloop.run(burst(url, max(levels), 2, 1, a.route, a.prompt_ids))
        print(f"sim TTFT {a.ttft * 1000:g} ms, ITL {a.itl * 1000:g} ms, {a.tokens} tokens/request, "
              f"{a.rounds} paired rounds (medians; [q1, q3] of the per-round differences); "
              f"{a.route}" + (f" with {a.prompt_ids} prompt ids" if a.prompt_ids else "")
              + f"; proxied = toposerve; load average {os.getloadavg()[0]:.2f}")
        width = max(11, *(len(n) for n, _ in paths))
        print(f"{'streams':>7} {'path':>{width}} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL':>7} "
              f"{'tok/s':>8} {'err':>4}")
        for level in levels:
            runs: dict[str, list[Round]] = {name: [] for name, _ in paths}
            for i in range(a.rounds):
                # Every path in every position over the rounds (two paths: alternating).
                k = i % len(paths)
                for name, url in paths[k:] + paths[:k]:
                    runs[name].append(uvloop.run(burst(url, level, a.tokens, a.sequential,
                                                       a.route, a.prompt_ids)))
            medians = {name: median_round(rs) for name, rs in runs.items()}
            for name, r in medians.items():
                print(f"{level:>7} {name:>{width}} {r.ttft_p50_ms:>8.2f}m {r.ttft_p99_ms:>8.2f}m "
                      f"{r.itl_mean_ms:>6.2f}m {r.tok_per_s:>8.1f} {r.errors:>4}")
            entry: dict[str, object] = {name: asdict(r) for name, r in medians.items()}
            for name, _ in paths[1:]:
                pairs = paired(runs["direct"], runs[name])
                added, ratio = pairs.added(), pairs.ratio()
                print(f"{level:>7} {'=> ' + name:>{width}} TTFT p50 {added:+.2f} ms "
                      f"[{pairs.added(25):+.2f}, {pairs.added(75):+.2f}], throughput "
                      f"{ratio:.1%} of direct [{pairs.ratio(25):.1%}, {pairs.ratio(75):.1%}]")
                key = "" if name == "proxied" else f"{name}_"
                entry |= {f"{key}ttft_p50_added_ms": added, f"{key}throughput_ratio": ratio,
                          f"{key}paired": asdict(pairs)}
            report[str(level)] = entry
            print(f"{level:>7} load average {os.getloadavg()[0]:.2f}")
    if a.json:
        a.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
