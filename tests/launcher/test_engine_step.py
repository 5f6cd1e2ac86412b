"""The engine step `probe --measure` times on a CPU-only machine: its record, its cache, and
what the CPU plan makes of it (no engine here: the live measurement is in
test_cpu_prediction.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import replace
from http.server import BaseHTTPRequestHandler
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
from launcher.probe.attentionfit import DepthPair
from launcher.probe.enginestep import EngineStep, EngineStepError, StepKey
from launcher.probe.topology import Topology
from loadgen.config import Config
from tests.support.cache import fresh_cache
from tests.support.postserver import PostServer

REPO = Path(__file__).resolve().parents[2]
KEY = StepKey("cpu: test CPU (2 threads)", "0.32.0", "2.13.0+cpu")


def record(step_s: float, key: StepKey = KEY) -> EngineStep:
    return EngineStep(key, step_s, (step_s, step_s * 1.1), 4_000_000, 8_000_000,
                      "2026-12-02T03:00:00", model_token_params=3_000_000,
                      model_head_params=500_000)


def test_a_record_survives_its_json_and_the_cache(tmp_path: Path) -> None:
    rec = record(0.009)
    assert enginestep.from_json(json.loads(json.dumps(enginestep.to_json(rec)))) == rec
    assert enginestep.save(tmp_path, rec) is not None
    assert enginestep.load(tmp_path, KEY) == rec
    other = StepKey(KEY.device, "0.33.0", KEY.torch)  # another vLLM: not this engine's step
    assert enginestep.load(tmp_path, other) is None


def at_depth(rec: EngineStep, extra_s: float = 0.4, cached: int = 2048, *, depth: int = 2048,
             new: int = 512) -> EngineStep:
    """``rec`` with a timing at depth: ``new`` tokens after ``depth`` cached ones, three rounds
    of pairs whose deep request took ``extra_s`` more than its plain 0.7 s partner."""
    return replace(rec, prefill_fixed_s=0.012, prefill_token_s=1.4e-3, depth_tokens=depth,
                   depth_new_tokens=new,
                   depth_pairs=tuple(DepthPair(0.7, 0.7 + extra_s, cached) for _ in range(3)))


def test_a_record_timed_at_depth_survives_its_json_and_a_format_2_record_still_reads(
    tmp_path: Path,
) -> None:
    rec = at_depth(record(0.009))
    assert enginestep.from_json(json.loads(json.dumps(enginestep.to_json(rec)))) == rec
    # the previous format, written before the timing at depth: read, with attention untimed
    old = {k: v for k, v in json.loads(json.dumps(enginestep.to_json(record(0.009)))).items()
           if not k.startswith("depth_")}
    old["version"] = 2
    assert enginestep.from_json(old) == replace(record(0.009), model_token_params=None,
                                                model_head_params=None)
    assert enginestep.from_json(old).depth_pairs == ()
    # format 4 (the model's weights in one count): read, its prefill rate not used, said so
    four = {**json.loads(json.dumps(enginestep.to_json(
        replace(record(0.009), prefill_fixed_s=0.012, prefill_token_s=30e-6)))), "version": 4}
    over = costmodel.cpu_step_overhead(enginestep.from_json(four), cores=2)
    assert over.prefill is None
    assert "prefill rate not used" in over.why
    # format 3 (one median difference, no pairs): read, its attention untimed
    three = {**json.loads(json.dumps(enginestep.to_json(record(0.009)))), "version": 3,
             "depth_tokens": 2048, "depth_new_tokens": 512, "depth_cached_tokens": 2048,
             "depth_extra_s": 0.4}
    assert costmodel.cpu_attention_pair_s(enginestep.from_json(three)) is None
    # format 1 (the offline engine's step) is refused in one line that says what to do
    with pytest.raises(EngineStepError, match="version '1' is not one of 2, "):
        enginestep.from_json({**old, "version": 1})
    assert enginestep.write_cache_json(enginestep.cache_path(tmp_path, KEY), {**old, "version": 1})
    kept, why = enginestep.read(tmp_path, KEY)
    assert kept is None
    assert "version '1' is not one of 2, " in why
    assert why.endswith("`launcher probe --measure` times the engine again")
    # half a timing at depth is refused, not read as half a figure
    broken = {**json.loads(json.dumps(enginestep.to_json(rec))), "depth_new_tokens": None}
    with pytest.raises(EngineStepError, match="depth_new_tokens missing"):
        enginestep.from_json(broken)
    # a pair that found more of the context than there is, or no pairs: refused
    with pytest.raises(EngineStepError, match="more than the context"):
        enginestep.from_json({**json.loads(json.dumps(enginestep.to_json(rec))), "depth_pairs": [
            {"plain_s": 0.7, "deep_s": 1.0, "cached": 4096}]})
    with pytest.raises(EngineStepError, match="non-empty"):
        enginestep.from_json({**json.loads(json.dumps(enginestep.to_json(rec))),
                              "depth_pairs": {"plain_s": 1}})


def test_the_attention_rate_is_the_deeper_prompts_extra_time_less_what_else_it_computed() -> None:
    """512 new tokens after 2,048 cached: the extra time is attention over 512 x 2,048 pairs and
    the host's cost of the context's length. 256 after 2,000 of which vLLM cached 1,920 (whole
    128-token blocks): the 80-token tail is computed at the timed per-token rate, not attention."""
    host = costmodel.PROMPT_TOKEN_HOST_S
    whole = at_depth(record(0.009), extra_s=512 * 2048 * 300e-9 + 2048 * host)
    assert costmodel.cpu_attention_pair_s(whole) == pytest.approx(300e-9)
    tail = at_depth(record(0.009), 80 * 1.4e-3 + 2000 * host + 336 * 1920 * 300e-9, 1920,
                    depth=2000, new=256)
    assert costmodel.cpu_attention_pair_s(tail) == pytest.approx(300e-9)
    # nothing cached, or a deeper prompt no slower than alone (noise): no rate, none negative
    assert costmodel.cpu_attention_pair_s(at_depth(record(0.009), cached=0)) is None
    assert costmodel.cpu_attention_pair_s(at_depth(record(0.009), extra_s=-0.01)) is None
    assert costmodel.cpu_attention_pair_s(record(0.009)) is None
    over = costmodel.cpu_step_overhead(whole, cores=2)
    assert over.pair_s == pytest.approx(300e-9)
    assert over.pair_reliable
    assert "300 ns a (query, key) pair, timed here" in over.why, over.why
    assert "not timed" in costmodel.cpu_step_overhead(
        replace(record(0.009), prefill_fixed_s=0.012, prefill_token_s=1.4e-3), cores=2).why


def test_the_kept_depth_figure_is_the_median_of_each_rounds_difference_from_its_own_prompt(
) -> None:
    """A machine that slows down between rounds slows both prompts of a round: the record keeps
    every round's pair, and the rate is read pair by pair (each deep request over its own plain
    partner, on the plain prompts' median scale), not from a difference of the medians; the
    round whose context was not found whole is dropped."""
    pairs = (DepthPair(0.7, 1.0, 2048), DepthPair(1.4, 2.0, 2048), DepthPair(0.75, 1.07, 2048),
             DepthPair(0.7, 0.9, 1920))
    timed = enginestep.Timed(steps_s=(0.008,) * 4, short_ttft_s=(0.03, 0.06, 0.03, 0.03),
                             long_ttft_s=tuple(p.plain_s for p in pairs), depth_pairs=pairs,
                             depth_tokens=2048)
    rec = enginestep.record(KEY, timed, params=4_000_000, weight_bytes=8_000_000,
                                token_params=3_000_000, head_params=500_000, now="now")
    assert (rec.depth_tokens, rec.depth_new_tokens, rec.depth_cached_tokens) == (
        2048, enginestep.LONG_PROMPT, 2048)
    fit = costmodel.cpu_attention_fit(rec)
    assert fit is not None
    assert (fit.kept, fit.dropped) == (3, 1)
    # every kept pair is 3/7 slower at depth, on the kept plain prompts' 0.75 s median scale
    extra = 0.75 * 3 / 7 - 2048 * costmodel.PROMPT_TOKEN_HOST_S
    assert fit.median_s == pytest.approx(extra / (512 * 2048), rel=0.02)
    untimed = enginestep.record(KEY, replace(timed, depth_pairs=(), depth_tokens=0),
                                params=4_000_000, weight_bytes=8_000_000,
                                token_params=3_000_000, head_params=500_000, now="now")
    assert costmodel.cpu_attention_fit(untimed) is None


def test_the_stream_reader_takes_the_cached_tokens_from_usage() -> None:
    usage = {"prompt_tokens": 2560, "completion_tokens": 1,
             "prompt_tokens_details": {"cached_tokens": 2048}}
    body = (b'data: {"choices": [{"index": 0, "text": "a"}]}\n\n'
            + b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
    got = enginestep.read_stream(0.0, [(1.0, body)])
    assert (got.completion_tokens, got.cached_tokens) == (1, 2048)
    assert enginestep.read_stream(0.0, [(1.0, body.replace(b"prompt_tokens_details", b"x"))]
                                  ).cached_tokens is None


def test_a_damaged_cache_file_reads_as_no_measurement(tmp_path: Path) -> None:
    path = enginestep.cache_path(tmp_path, KEY)
    path.parent.mkdir(parents=True)
    for junk in ("", "{", "[]", '{"version": 1}', json.dumps({**enginestep.to_json(record(0.01)),
                                                            "step_s": -1})):
        path.write_text(junk)
        assert enginestep.load(tmp_path, KEY) is None


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                max_size=6),
    max_leaves=20,
)


@given(st.dictionaries(st.sampled_from(["version", "key", "step_s", "steps_s", "model_params",
                                        "model_weight_bytes", "measured_at", "prefill_fixed_s",
                                        "prefill_token_s", "depth_tokens", "depth_new_tokens",
                                        "depth_pairs", "model_pair_flops", "batch_streams",
                                        "batch_steps_s", "unread_rounds"]), JSON))
@settings(max_examples=300)
def test_any_saved_record_reads_or_is_refused_in_one_line(raw: dict[str, Any]) -> None:
    good = enginestep.to_json(at_depth(record(0.01)))
    merged = {**good, **raw}
    try:
        rec = enginestep.from_json(merged)
    except EngineStepError as exc:
        message = str(exc)
    else:
        message = ""
        assert rec.step_s > 0
        assert all(s > 0 for s in rec.steps_s)
    assert "\n" not in message


def test_a_slower_engine_step_gives_a_slower_cpu_plan() -> None:
    m = load_model_spec(str(ensure_tiny_model()))

    def timed(step_s: float) -> EngineStep:  # as the pipeline keeps it for the embedded model
        return replace(record(step_s), model_params=m.active_params,
                       model_weight_bytes=int(costmodel.streamed_weight_bytes(m, 1)),
                       model_token_params=m.token_params, model_head_params=m.lm_head_params)

    fast = plan(Topology(gpus=(), engine_step=timed(0.004)), m, Policy(cpu_cores=2))
    slow = plan(Topology(gpus=(), engine_step=timed(0.012)), m, Policy(cpu_cores=2))
    # The tiny model's own forward pass is the measured model's: its decode is the step itself.
    assert 1 / fast.predicted.decode_tok_s == pytest.approx(0.004, rel=1e-6)
    assert 1 / slow.predicted.decode_tok_s == pytest.approx(0.012, rel=1e-6)
    assert any("timed on this machine" in r for r in slow.reasons)


def test_the_overhead_is_the_step_less_the_measured_models_forward_pass() -> None:
    over = costmodel.cpu_step_overhead(record(0.010), cores=2)
    assert over.measured
    # one token through the layers and the LM head
    forward = costmodel.cpu_forward_s(2 * (3_000_000 + 500_000), 8_000_000, 2)
    assert over.seconds == pytest.approx(0.010 - forward)
    # a step faster than the roofline's arithmetic (a machine quicker than assumed) is no
    # negative overhead
    assert costmodel.cpu_step_overhead(record(1e-5), cores=2).seconds == 0.0


def run_plan(env: dict[str, str], *extra: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "launcher", "plan", "--model", str(ensure_tiny_model(env)),
         *extra], cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=True)
    return done.stdout


def test_plan_uses_the_step_probe_kept_for_this_machine_but_not_for_a_saved_topology(
    tmp_path: Path, tiny_model_path: str
) -> None:
    cache = fresh_cache(tmp_path, tiny_model=tiny_model_path)
    env = {**os.environ, "TOPOSERVE_CACHE": str(cache)}
    rec = record(0.0125, enginesteps.key_here(env))
    assert enginestep.save(tmp_path, rec) is not None
    out = run_plan(env)
    assert "engine step overhead 12.0 ms" in out or "timed on this machine" in out, out
    topo = tmp_path / "cpu.json"
    topo.write_text(json.dumps({"format": "toposerve-topology/1", "gpus": []}))
    elsewhere = run_plan(env, "--topology", str(topo))
    assert "timed on this machine" not in elsewhere, elsewhere


def streamed(first: float, step: float, tokens: int, stall: tuple[float, float] = (0, 0)
             ) -> enginestep.Streamed:
    """A stream sent at 0 whose first token came at ``first`` and one more every ``step``
    seconds, read by a client held up over ``stall`` (from, to): what came in between arrives
    together when it wakes."""
    times = [first + i * step for i in range(tokens)]
    held = [stall[1] if stall[0] <= t < stall[1] else t for t in times]
    return enginestep.Streamed(0.0, tuple(held), tokens)


def test_the_step_at_many_streams_is_their_median_decode_step_while_in_flight_together() -> None:
    """Streams handed over a little apart: the step is their decode step as loadgen reads it,
    whether or not the client was held up mid-stream (the tokens then arrive in a burst);
    streams whose first tokens lie too far apart to have decoded together for half their
    tokens give no step."""
    together = [streamed(0.02 + 0.003 * i, 0.008, 129) for i in range(16)]
    assert enginestep.batch_step(together) == pytest.approx(0.008)
    held = [streamed(0.02 + 0.003 * i, 0.008, 129, stall=(0.4, 0.9)) for i in range(16)]
    assert enginestep.batch_step(held) == pytest.approx(0.008)
    late = [*together[:15], streamed(0.8, 0.008, 129)]
    assert enginestep.batch_step(late) is None
    assert enginestep.batch_step(together[:1]) is None


def at_many(rec: EngineStep, step_s: float, streams: int = 16) -> EngineStep:
    return replace(rec, batch_streams=streams, batch_steps_s=(step_s, step_s * 1.05, step_s))


def test_a_record_with_its_step_at_many_streams_survives_json_and_a_format_5_one_reads_assumed(
) -> None:
    rec = at_many(record(0.004), 0.009)
    assert enginestep.from_json(json.loads(json.dumps(enginestep.to_json(rec)))) == rec
    five = {**json.loads(json.dumps(enginestep.to_json(record(0.004)))), "version": 5}
    five.pop("batch_streams")
    five.pop("batch_steps_s")
    old = enginestep.from_json(five)
    assert old.batch_step_s is None
    over = costmodel.cpu_step_overhead(old, cores=2)
    assert over.seq_s == 0.0
    assert "cost per sequence assumed" in over.why, over.why
    saved = json.loads(json.dumps(enginestep.to_json(rec)))
    with pytest.raises(EngineStepError, match="batch_steps_s missing"):
        enginestep.from_json({**saved, "batch_steps_s": None})
    with pytest.raises(EngineStepError, match="not many streams"):
        enginestep.from_json({**saved, "batch_streams": 1})


def test_each_sequence_more_costs_the_timed_step_at_many_less_one_over_the_extra_streams() -> None:
    """A step of 16 streams timed at 9 ms against one stream's 4 ms: each of the 15 more costs
    (9 - 4 - their tokens' arithmetic) / 15; the plan's step at 32 streams pays 31 of them, at
    one stream none; its many-stream throughput falls by that, its one-stream decode not."""
    m = load_model_spec(str(ensure_tiny_model()))

    def timed(rec: EngineStep) -> EngineStep:  # as the pipeline keeps it, prefill and all
        return replace(rec, model_params=m.active_params,
                       model_weight_bytes=int(costmodel.streamed_weight_bytes(m, 1)),
                       model_token_params=m.token_params, model_head_params=m.lm_head_params,
                       prefill_fixed_s=0.013, prefill_token_s=45e-6)

    one, many = timed(record(0.004)), timed(at_many(record(0.004), 0.009))
    over = costmodel.cpu_step_overhead(many, cores=2)
    assert over.prefill is not None

    def fwd(n: int) -> float:  # the tokens' arithmetic at the prefill rate timed beside it
        return costmodel.cpu_forward_s(costmodel.gemm_flops(m.token_params, m.lm_head_params,
                                                            n, n),
                                       costmodel.streamed_weight_bytes(m, 1), 2,
                                       over.prefill.flops_s)
    assert over.seq_s == pytest.approx((0.009 - 0.004 - (fwd(16) - fwd(1))) / 15, rel=1e-6)
    assert "each sequence more in a step" in over.why, over.why
    # a step of many no slower than one stream (noise): no negative cost
    assert costmodel.cpu_step_overhead(timed(at_many(record(0.004), 0.003)), 2).seq_s == 0.0
    for n in (1, 32):
        flat = plan(Topology(gpus=(), engine_step=one), m, Policy(cpu_cores=2, concurrency=n))
        wide = plan(Topology(gpus=(), engine_step=many), m, Policy(cpu_cores=2, concurrency=n))
        assert wide.predicted.decode_tok_s == pytest.approx(flat.predicted.decode_tok_s)
        p = wide.predicted
        step = 0.004 + fwd(n) - fwd(1) + (n - 1) * over.seq_s
        assert p.throughput_tok_s == pytest.approx(n * 256 / (n * p.ttft_s + 256 * step),
                                                   rel=1e-6)
        if n == 1:
            assert p.throughput_tok_s == pytest.approx(flat.predicted.throughput_tok_s)
        else:
            assert p.throughput_tok_s < 0.6 * flat.predicted.throughput_tok_s


class Recording(PostServer):
    """A vLLM-like completions server on a loopback socket that streams ``max_tokens`` token
    events, one every STEP_S after a first token FIRST_S, and keeps every request's body in
    the order it came."""

    STEP_S = 0.001
    FIRST_S = 0.005

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        super().__init__(self.respond)

    def respond(self, handler: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        self.bodies.append(body)
        handler.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.end_headers()
        n = int(body["max_tokens"])
        time.sleep(self.FIRST_S)
        for i in range(n):
            if i:
                time.sleep(self.STEP_S)
            event = {"choices": [{"index": 0, "text": f" t{i}"}], "usage": None}
            handler.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        usage = {"choices": [], "usage": {"prompt_tokens": len(body["prompt"]),
                                          "completion_tokens": n}}
        handler.wfile.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")


def timed_by_recording(rounds: int, batch: int) -> tuple[Recording, enginestep.Timed]:
    """``probe --measure``'s engine timing against a Recording server (closed after it): the
    server, for the requests it was sent, and what the timing read."""
    server = Recording()
    try:
        return server, enginestep.time_served(enginestep.Served(server.url, "recording"), 1000,
                                              rounds=rounds, depth=0, batch=batch)
    finally:
        server.close()


def test_the_decode_is_timed_as_loadgen_sends_it_back_to_back_greedy_at_its_default_length(
) -> None:
    """The one-stream decode is timed in the request pattern loadgen's default run sends:
    decodes of its --gen, greedy, one right after another, never between the rounds' one-token
    requests (timed between them, sampled, 129 tokens out, the step read 0.75-1.09 of loadgen's
    on one engine, this pattern 0.97-1.15: docs/planner.md 7c); every round still has its first
    tokens. Only the requests are asserted (a decode this host held up may be sent again)."""
    server, got = timed_by_recording(rounds=3, batch=0)
    gen = Config().gen  # loadgen's default: 256 tokens out
    sizes = [b["max_tokens"] for b in server.bodies]
    decodes = [i for i, n in enumerate(sizes) if n > 8]
    assert len(decodes) >= 3, sizes
    assert all(sizes[i] == gen for i in decodes), sizes
    # after the warm-ups and every round's one-token requests, one decode after another
    assert decodes == list(range(decodes[0], len(sizes))), sizes
    assert sizes[2:decodes[0]] == [1, 1] * 3, sizes
    assert all(b["temperature"] == 0.0 for b in server.bodies), server.bodies
    assert (len(got.steps_s), len(got.short_ttft_s), len(got.long_ttft_s)) == (3, 3, 3), got


def test_the_step_at_many_streams_is_timed_over_a_context_of_each_streams_own() -> None:
    """The streams sent at once each decode after a LONG_PROMPT-token context of their own,
    sent alone (one token) into the prefix cache before them and the same in every batch round:
    over one shared context their attention read the same cached blocks, and 8 streams stepped
    18-27% faster than over contexts of their own (enginestep.BATCH_STREAMS)."""
    server, got = timed_by_recording(rounds=1, batch=4)
    long_ = enginestep.LONG_PROMPT
    cached = [b["prompt"] for b in server.bodies
              if b["max_tokens"] == 1 and len(b["prompt"]) == long_]
    batches = [b["prompt"] for b in server.bodies
               if len(b["prompt"]) == long_ + enginestep.SHORT_PROMPT]
    # the warm round, then BATCH_ROUNDS kept; a round a loaded host held up is not kept and is
    # sent again (time_served: up to 2 x BATCH_ROUNDS after the warm one), so count what came
    sent, part = divmod(len(batches), 4)
    assert part == 0, len(batches)
    not_kept = [u for u in got.unread_rounds if "at 4 streams" in u]
    assert sent == 1 + len(got.batch_steps_s) + len(not_kept), (sent, got)
    rounds = enginestep.BATCH_ROUNDS
    assert len(got.batch_steps_s) == rounds or sent == 1 + 2 * rounds, got
    contexts = {tuple(p[:long_]) for p in batches}
    assert len(contexts) == 4, "the streams share a context"
    assert contexts <= {tuple(p) for p in cached}, "a stream's context was not cached before"
