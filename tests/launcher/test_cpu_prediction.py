"""The planner's CPU-engine prediction against loadgen on the real vLLM CPU engine serving the
tiny model; and the pure parts of the timing (its stream reader, its prefill line)."""

from __future__ import annotations

import itertools
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.model.modelspec import load_model_spec
from launcher.model.tinymodel import ensure_tiny_model
from launcher.pipeline import enginesteps
from launcher.planner import costmodel
from launcher.planner.plan import Policy, plan
from launcher.probe import enginestep
from launcher.probe.topology import Topology
from loadgen.api import run as loadgen_run
from loadgen.config import Config
from tests.conftest import live_processes
from tests.support.vllmmetrics import engine_step_totals

# Rounds of (time the engine as `probe --measure` does, plan from it, run loadgen), one after
# the other on the same engine: each pair sees the machine as it is in those seconds, and the
# median of the pairs' ratios leaves out a round that a burst of other work disturbed. Three
# rounds, and up to two more while the median is outside the band: on CI's shared two cores the
# median of three rounds once put the plan's prefill 28% below loadgen's while the one round the
# message showed agreed within 6% (the other rounds' figures were cut from that message). A
# plan wrong by more than the band misses in every round, so the extra rounds cannot pass it;
# they only outvote a disturbed one.
ROUNDS = 3
MAX_ROUNDS = 5
# loadgen's one-stream run is its default one, 8 requests (this test asked for 4 until
# 2026-12-05), and its decode is compared where more than half of them had a decode to read. A
# loaded machine moves a few streams more than the engine: vLLM's server holds a stream's tokens
# back and sends them in one burst (no decode: None), sends its last tokens late (a step read
# slow) or its first token with later ones (read fast). Beside one busy loop the engine's own
# step read 2.35-2.71 ms a request (quiet 2.35-3.20), loadgen's requests 1.14-4.30 ms. The
# probe's step is a median of 7 such decodes (enginestep.ROUNDS); the p50 of 4 requests, the
# middle two of at most 4 readable, moves with two disturbed streams: beside a load busy 0.4 s
# in 1.2 s, 4 requests read plan/loadgen 1.63, 1.11, 1.09 (2 of 4 readable each; the engine's
# own step 3.32 ms in the first, 2.56 in the probe's timing) and the 8 requests right after them
# 0.97, 0.98, 0.99; beside 50 ms busy in 300 ms 0.92-1.01 and 0.97-1.03 (2026-12-05). A round
# whose requests were mostly held back is not compared, said in the message, and another is
# run: at most MAX_ROUNDS + 2 rounds in all.
BAND = 0.25  # issue 22: the CPU plan within 25% of what loadgen measures on the same machine
# Each half of a round starts on a quiet machine: under this share of all cores busy over a
# second (the stack's engine idles near zero between requests), waiting at most QUIET_WAIT_S.
QUIET_BUSY = 0.25
QUIET_WAIT_S = 15.0
# Many streams: loadgen's own run at this concurrency (its default requests, 4 a stream) against
# the plan for as many, held to the same band. 8, not the 32 a throughput plan assumes: on this
# 2-core machine loadgen's 32-stream run takes ~25 s a round, the 8-stream one ~10 s; the step
# at many sequences `probe --measure` times (16 streams) lies between them, and the plan at 8 and
# at 32 streams read 1.01-1.24 and 0.99-1.12 of loadgen's in three rounds by hand on 2026-12-03
# (1.25-1.70 and 1.48-1.81 without it; docs/planner.md 7c).
MANY = 8


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot, from /proc/stat's first line."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = f[3] + (f[4] if len(f) > 4 else 0)  # idle + iowait
    return sum(f) - idle, sum(f)


def _tree_jiffies(roots: set[int]) -> int:
    """CPU jiffies (user + system) of the live processes in ``roots`` and below them."""
    parent: dict[int, int] = {}
    used: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            f = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        parent[int(entry.name)], used[int(entry.name)] = int(f[1]), int(f[11]) + int(f[12])

    def ours(pid: int) -> bool:
        while pid > 1 and pid not in roots:
            pid = parent.get(pid, 0)
        return pid in roots

    return sum(j for pid, j in used.items() if ours(pid))


class Beside:
    """What the rest of the machine used while a half ran: the cores busy over it less the
    stack's processes and this one, so that a failure says whether other work ran beside the
    engine (the engine's spinning threads take ~2 cores while it serves, and work beside it got
    0.02-0.4 of a core here, holding the server's token events back)."""

    def __init__(self, stack: Any) -> None:
        self.roots = {os.getpid()} | ({stack.launcher_pid} if stack.launcher_pid else set())
        self.known = bool(stack.launcher_pid)
        self.start = (*_cpu_times(), _tree_jiffies(self.roots))

    def cores(self) -> str:
        busy, total, ours = (*_cpu_times(), _tree_jiffies(self.roots))
        cpus = os.cpu_count() or 1
        wall = (total - self.start[1]) / cpus  # jiffies of one core
        if not self.known:
            return f"{(busy - self.start[0]) / max(1, wall):.2f} cores busy in all"
        beside = max(0, (busy - self.start[0]) - (ours - self.start[2]))
        return f"{beside / max(1, wall):.2f} of a core beside"


def wait_for_quiet() -> float:
    """Wait (at most QUIET_WAIT_S) until the machine's cores were under QUIET_BUSY busy for a
    second; the last second's busy share, which the failure message shows."""
    deadline = time.monotonic() + QUIET_WAIT_S
    busy = 1.0
    while time.monotonic() < deadline:
        b0, t0 = _cpu_times()
        time.sleep(1.0)
        b1, t1 = _cpu_times()
        busy = (b1 - b0) / max(1, t1 - t0)
        if busy < QUIET_BUSY:
            break
    return busy


def engine_steps(stack: Any) -> tuple[float, float]:
    """(sum, count) of the stack's engine's own inter-token latency histogram so far: over a run,
    the engine's own mean step while it ran, a third reading beside the probe's and loadgen's."""
    return engine_step_totals(stack.vllm_url)


def loadgen_figures(stack: Any, concurrency: int = 1,
                    warm: bool = True) -> tuple[tuple[float, float | None, float], int, int, str]:
    """loadgen's default run (512-token prompts, 256 tokens out, its default requests: 8 at one
    stream, 4 a stream at more, after its default warm-up) against the engine: p50 prefill and
    decode tok/s and the run's output tok/s, as it prints them (the decode None where no request
    had one); how many requests had a decode to read, of how many; and for the failure message
    each request's decode step, its longest gap between token events, and the engine's own mean
    step over the run (engine_steps). ``warm``: False for an engine that has run these very
    requests already (a round after the first): loadgen's unmeasured warm-up requests (two; one a
    stream) are then left out, the measured requests the same."""
    cfg = Config(url=stack.vllm_url, api_key=stack.engine_key, concurrency=concurrency,
                 warmup=None if warm else 0, progress=False)
    requests = cfg.requests_for(concurrency)
    before = engine_steps(stack)
    level = loadgen_run(cfg).levels[0]
    after = engine_steps(stack)
    summary = level.summary
    assert summary.requests_ok == requests, summary.failures
    assert summary.prefill_tok_s.p50
    assert summary.output_tok_s
    # which side moved when the halves disagree: a held-back stream (its tokens sent at once,
    # no decode: None) or a long gap (the server or this process held the stream up) shows here
    steps = [f"{1e3 / r.decode_tok_s:.2f}" if r.decode_tok_s else "None" for r in level.requests]
    gaps = [f"{max(r.itl_s, default=0.0) * 1e3:.0f}" for r in level.requests]
    made = after[1] - before[1]
    own = f"{(after[0] - before[0]) / made * 1e3:.2f} ms" if made > 0 else "none"
    # where a run's time went when its throughput fell and its steps did not: requests that
    # waited for their first token (the server), or loadgen's loop late. A late loop here has
    # been the whole machine's stall, not this process's: a sleeping witness process was late
    # by the same 0.8-0.95 s in the same seconds, and loadgen in a process of its own no steadier
    # (benchmarks/loadgen_own_process.py, 2026-12-05)
    ms = [(d.p50 or 0.0) * 1e3 for d in (summary.ttft_s, summary.e2e_s)]
    lag = summary.loop.lag_s.max if summary.loop is not None else None
    detail = (f"loadgen x{concurrency}: steps {', '.join(steps[:8])} ms (longest gaps "
              f"{', '.join(gaps[:8])} ms), the engine's own mean step {own}; its run "
              f"{summary.duration_s:.1f} s, first token p50 {ms[0]:.0f} ms, max "
              f"{(summary.ttft_s.max or 0.0) * 1e3:.0f} ms, a request p50 {ms[1]:.0f} ms, its "
              f"loop late by at most {(lag or 0.0) * 1e3:.0f} ms")
    readable = sum(r.decode_tok_s is not None for r in level.requests)
    return ((summary.prefill_tok_s.p50, summary.decode_tok_s.p50, summary.output_tok_s),
            readable, len(level.requests), detail)


@pytest.mark.stack
def test_cpu_plan_from_the_engine_timed_here_is_within_25_percent_of_what_loadgen_measures(
    stack: Any, tmp_path: Path
) -> None:
    """`probe --measure`'s timing (through the served engine, as loadgen reads it) taken on the
    stack's engine, the plans made from what it kept, and loadgen's default runs, round by round:
    prefill, decode and output throughput of one stream and output throughput of MANY streams,
    each within 25%. No other engine is started (timing one engine and serving from another
    minutes later read 1.7x apart on this loaded machine)."""
    cache = tmp_path / "cache"  # a cache of its own: a real measurement kept here stays
    cache.mkdir()
    (cache / "models").symlink_to(Path(stack.model_path).parent)
    env = {**os.environ, "TOPOSERVE_CACHE": str(cache)}
    served = enginestep.Served(stack.vllm_url, stack.model, stack.engine_headers)
    m = load_model_spec(stack.model_path)
    ratios: list[tuple[float, float, float, float]] = []
    seen = []

    def outside() -> list[tuple[str, float]]:
        medians = [(what, statistics.median(r[i] for r in ratios))
                   for i, what in enumerate(("prefill", "decode", "throughput",
                                             f"throughput at {MANY} streams"))]
        return [(what, m) for what, m in medians if not 1 - BAND < m < 1 + BAND]

    while (len(ratios) < ROUNDS or (outside() and len(ratios) < MAX_ROUNDS)) \
            and len(seen) < MAX_ROUNDS + 2:
        quiet = wait_for_quiet()
        probed = Beside(stack)
        # attention: not compared here; the step at many streams: timed (the default)
        line = enginesteps.measure(env, served, depth=0)
        probed_beside = probed.cores()
        assert "kept in" in line, line
        topo = enginesteps.attach(Topology(gpus=(), source="nvml"), env)
        assert topo.engine_step is not None, "plan does not find what probe --measure kept"
        p = plan(topo, m, Policy(cpu_cores=os.cpu_count() or 1))  # 512 -> 256, one stream
        assert any("timed on this machine" in r for r in p.reasons), p.reasons
        many = plan(topo, m, Policy(cpu_cores=os.cpu_count() or 1, concurrency=MANY))
        pred = (p.predicted.prefill_tok_s, p.predicted.decode_tok_s, p.predicted.throughput_tok_s,
                many.predicted.throughput_tok_s)
        quiet_too = wait_for_quiet()
        # loadgen's warm-up only in the first round: later rounds' engine has run these very
        # requests a round before (the warm-ups took ~10 s a round on two cores: the two runs
        # 9.1 and 37.1 s warmed, 6.3-7.6 and 29.8-34.4 s not, on 2026-12-04)
        warm = not seen
        measured = Beside(stack)
        one, readable, sent, one_detail = loadgen_figures(stack, warm=warm)
        many_got, _, _, many_detail = loadgen_figures(stack, MANY, warm=warm)
        beside = f"{probed_beside} over the probe's timing, {measured.cores()} over loadgen's"
        prefill, decode, output = one
        if decode is None or 2 * readable <= sent:
            seen.append(f"not compared: {readable} of loadgen's {sent} requests had a decode to "
                        f"read (held back); {beside}; planned {[round(x) for x in pred]}; "
                        f"probe: {line}; {one_detail}")
            continue
        got = (prefill, decode, output, many_got[2])
        ratios.append((pred[0] / got[0], pred[1] / got[1], pred[2] / got[2], pred[3] / got[3]))
        seen.append(f"busy {quiet:.0%}/{quiet_too:.0%} before the halves, {beside}; planned "
                    f"(prefill, decode, output tok/s; output tok/s at {MANY} streams) "
                    f"{[round(x) for x in pred]}, loadgen {[round(x) for x in got]}; "
                    f"probe: {line}; {one_detail}; {many_detail}")
    print("\n".join(seen))  # shown by `pytest -s`: how far apart the halves read when it passes
    if len(ratios) < ROUNDS:
        pytest.fail(f"only {len(ratios)} of {len(seen)} rounds had loadgen's decode to compare "
                    "(the machine held the engine's streams back)\n" + "\n".join(seen))
    if missed := outside():
        # every round in full: pytest would shorten an assertion's repr to one line
        pytest.fail(f"median plan/loadgen outside 1 +- {BAND}: {missed}\n" + "\n".join(seen))


def test_without_a_timed_step_the_plan_says_the_step_is_assumed() -> None:
    p = plan(Topology(gpus=()), load_model_spec(str(ensure_tiny_model())), Policy(cpu_cores=2))
    assert any("engine step overhead assumed" in r for r in p.reasons), p.reasons


def test_the_plan_gives_back_the_timed_models_own_first_token_and_step() -> None:
    """Planned for the model it was timed on, the plan's time to first token is the timed line
    at the prompt's length and its decode step the timed step: nothing is added twice."""
    m = load_model_spec(str(ensure_tiny_model()))
    key = enginestep.StepKey("cpu: test CPU (2 threads)", "0.32.0", "2.13.0+cpu")
    step = enginestep.EngineStep(key, 0.004, (0.004,), m.active_params,
                                 int(costmodel.streamed_weight_bytes(m, 1)), "now", 0.012, 30e-6,
                                 model_token_params=m.token_params,
                                 model_head_params=m.lm_head_params)
    p = plan(Topology(gpus=(), engine_step=step), m, Policy(cpu_cores=2, prompt_tokens=1024))
    assert p.predicted.ttft_s == pytest.approx(0.012 + 1024 * 30e-6, rel=1e-6)
    assert 1 / p.predicted.decode_tok_s == pytest.approx(0.004, rel=1e-6)
    # a larger model's prompt costs its own arithmetic at the rate timed here: ten times the
    # layers' weights, the same LM head
    big = replace(m, active_params=m.active_params + 9 * m.token_params)
    over = costmodel.cpu_step_overhead(step, 2)
    assert over.prefill is not None
    ttft = costmodel.predict_cpu(big, 2, prompt=1024, gen=1, concurrency=1,
                                 step_overhead_s=over.seconds, prefill=over.prefill).ttft_s
    assert ttft == pytest.approx(0.012 + 10 * 1024 * 30e-6, rel=1e-6)


def test_the_prefill_line_goes_through_both_prompts() -> None:
    fixed, per_token = enginestep.prefill_line(0.010, 0.010 + 1008 * 2e-5, 16, 1024)
    assert per_token == pytest.approx(2e-5)
    assert fixed == pytest.approx(0.010 - 16 * 2e-5)
    # a long prompt measured faster than the short one (noise): a fixed cost only
    assert enginestep.prefill_line(0.02, 0.019)[0] == pytest.approx(0.02, rel=1e-6)


def sse(n: int) -> bytes:
    events: list[dict[str, Any]] = [{"choices": [{"index": 0, "text": f"t{i}"}], "usage": None}
                                    for i in range(n)]
    events.append({"choices": [], "usage": {"prompt_tokens": 16, "completion_tokens": n}})
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + \
        b"data: [DONE]\n\n"


@given(st.integers(1, 40), st.lists(st.integers(0, 5000), max_size=30), st.booleans())
@settings(max_examples=300)
def test_token_events_are_stamped_with_the_piece_that_completed_them(
    n: int, cuts: list[int], crlf: bool
) -> None:
    body = sse(n)
    if crlf:
        body = body.replace(b"\n", b"\r\n")
    edges = sorted({0, len(body), *(c % (len(body) + 1) for c in cuts)})
    pieces = [(float(i + 1), body[a:b]) for i, (a, b) in enumerate(itertools.pairwise(edges))]
    got = enginestep.read_stream(0.0, pieces)
    assert got.completion_tokens == n
    assert len(got.token_times) == n
    assert list(got.token_times) == sorted(got.token_times)
    # each event's stamp is that of the piece in which its terminating blank line arrived
    term = b"\r\n\r\n" if crlf else b"\n\n"
    for i in range(n):
        last = body.index(term, body.index(f'"t{i}"'.encode())) + len(term) - 1
        assert got.token_times[i] == next(
            t for (t, _), (a, b) in zip(pieces, itertools.pairwise(edges), strict=True)
            if a <= last < b)


@given(st.lists(st.binary(max_size=60), max_size=12))
@settings(max_examples=300)
def test_any_bytes_read_as_a_stream_without_an_exception(chunks: list[bytes]) -> None:
    got = enginestep.read_stream(0.0, [(float(i), c) for i, c in enumerate(chunks)])
    assert got.completion_tokens is None or isinstance(got.completion_tokens, int)


SIM = Path(__file__).with_name("simengine_as_vllm.py")


def sim_env(tmp_path: Path, ttft: float, itl: float) -> dict[str, str]:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "models").symlink_to(ensure_tiny_model().parent)
    return {**os.environ, "TOPOSERVE_CACHE": str(cache), "SIM_TTFT": str(ttft),
            "SIM_ITL": str(itl), "TOPOSERVE_ENGINE_CMD": f"{sys.executable} {SIM}"}


def test_probe_measure_starts_the_engine_keeps_its_timings_and_stops_it(tmp_path: Path) -> None:
    """The start path of `probe --measure` on a CPU, with the simulated engine (exact timings)
    in vLLM's place: the step and first token it keeps are the engine's, and nothing of the
    engine is left running. The bounds only say "no faster than the engine was made to be, and
    not many times slower" (a loaded machine wakes a sleeping engine late, never early)."""
    env = sim_env(tmp_path, ttft=0.03, itl=0.004)
    line = enginesteps.measure(env)
    assert "kept in" in line, line
    rec = enginestep.load(Path(env["TOPOSERVE_CACHE"]), enginesteps.key_here(env))
    assert rec is not None
    assert 0.0036 < rec.step_s < 0.04, rec
    assert rec.prefill_fixed_s is not None
    assert 0.027 < rec.prefill_fixed_s < 0.5, rec
    assert not [cmd for _, cmd in live_processes() if str(SIM) in cmd]


def test_probe_measure_of_an_engine_that_does_not_start_is_one_line(tmp_path: Path) -> None:
    env = {**sim_env(tmp_path, 0.01, 0.001), "TOPOSERVE_ENGINE_CMD":
           f"{sys.executable} -c 'import sys; sys.exit(\"no engine here\")'"}
    with pytest.raises(enginestep.EngineStepError) as err:
        enginesteps.measure(env)
    assert "\n" not in str(err.value)
    assert "exited with 1" in str(err.value)
    assert "no engine here" in str(err.value)
