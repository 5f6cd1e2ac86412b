"""Load on the roofline: the requested workload through the simulated scheduler. Pure.

A one-request figure says nothing of what ``--concurrency N`` streams see: four 16k-token
prompts sent together go through vLLM's batched-token budget one chunk after another, so the
last one's first token comes about four prefills later (H200, Gemma-3-27B shape: TTFT p50 3.09 s
measured against 1.43 s for one request). This times each step of
:mod:`launcher.planner.schedsim` with the roofline's own terms (:class:`RooflineStep`), or with
the kernel table the candidate was predicted from (:func:`kernelcost.step_cost`), and runs the
plan's workload (``--prompt``, ``--gen``, ``--concurrency``) under the layout's scheduler limits
(the memory fit's batched-token budget and KV blocks, the policy's ``max_num_seqs``): TTFT
p50/p90 and TPOT p50 at that concurrency.

Single-stream prefill and decode stay the closed formulas' (:func:`costmodel.predict`), and so
does the roofline's aggregate throughput (docs/planner.md, "Load through the simulated
scheduler", compares both against every recorded H200 run). Pipeline-parallel layouts are not
simulated: vLLM keeps ``pp`` micro-batches in flight, one step per stage at a time, which one
step after another cannot represent; their plans keep the closed formula and say so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property

from launcher.model.modelspec import ModelSpec
from launcher.planner import costmodel, hardware, memfit
from launcher.planner.asyncsched import vllm_async_scheduling
from launcher.planner.costmodel import Layout, Prediction
from launcher.planner.hardware import HostProfile, LayerHost, loop_split
from launcher.planner.kernelcost import layout_step
from launcher.planner.layouts import Links, Shape, candidate_layout, evaluate
from launcher.planner.memfit import BLOCK_TOKENS, Fit
from launcher.planner.plantypes import Candidate, Policy
from launcher.planner.schedsim import (
    SchedulerLimits,
    SimError,
    SimResult,
    StepBatch,
    Workload,
    percentiles,
    simulate,
)
from launcher.probe.hostcost import PACE_SPREAD, UNSTEADY, HostTiming
from launcher.probe.kernels import KernelTable
from launcher.probe.topology import Topology
from topocommon.quantiles import percentile

# loadgen's default run at a concurrency: 4 requests per stream (loadgen/cli.py --requests);
# its warm-up before them is not simulated (a warm engine is what a plan describes)
LOADGEN_REQUESTS_PER_STREAM = 4
# How far a run's median may move: a tenth of the requests landing on the other side of it
# (a run's own order of arrivals and steps), i.e. its 40th to 60th percentile; said where that
# span is wider than +-15% of the p50 (the tables' bar), as where first tokens come in waves
# through the batched-token budget and the median falls on the step between two of them
# (issue 22's ninth table: a 4-bit model's 32-stream p50 landed in a wave of 15 of 128)
MEDIAN_SHIFT = 10.0
MEDIAN_STEP = 0.15
# The way in a request takes before the scheduler sees it is the host's work, and a host's pace
# moves: the engines on the lent H200 kept x0.69-1.13 of a sampled one (hostcost.PACE_SPREAD,
# measured, not fitted here). Where several streams send at once, a request a few ms sooner or
# later may make or miss the step the scheduler is choosing (issue 22, table 13's Gemma-3-12B
# 16k prompts four at once: request 5 made request 2's last decode step on the engine, ~3 ms
# too late in the plan, and waited a chunk). The chosen layout's run is simulated again with
# its way in at both ends of that spread; where the TTFT p50 moves by more than RACE_SHIFT of
# itself between them the plan says so, with the span (its figures stay the planned ones).
# RACE_SHIFT is the tables' 10% band, ASSUMED (not fitted): a move a run could not tell from
# its own spread is not called a race.
WAY_IN_SPREAD = PACE_SPREAD
RACE_SHIFT = 0.10
# A host timing whose rounds ran at another speed than a running thread kept after them
# (HostTiming.pace apart from 1 by more than hostcost.UNSTEADY, where its note says host-bound
# figures "may come out up to x... faster/slower than planned") is planned at the sampled pace,
# but an engine may keep the rounds' speed instead, and which one a run keeps is not known before
# it (hostcost.PACE_SPREAD). Issue 22's fourteenth table: Qwen2.5-1.5B, planned at pace 1.51,
# measured between that plan and the same plan at pace 1 on prefill, decode, 32-stream tok/s
# and TTFT p50 (16k output tok/s one at once 1.5% past the pace-1 end). So the chosen layout is
# predicted again at the ends of the paces the host was seen at before the run
# (HostTiming.pace_ends, :func:`host_pace_span`) and the plan gives each figure that moves as the
# span over the planned and those predictions (its planned figures unchanged): every float
# figure of the prediction, one and many streams. The fast end is the least of the sampled
# fastest tenth and the rounds, not the rounds alone: the fifteenth table's rounds ran in a
# slow spell (x1.38 the sampled pace) and its Qwen2.5-1.5B engine at the fast level, so a span
# from the rounds to the planned pace held 1 of its 8 figures (benchmarks/gpu/host-pace-t15.md).
PACE_FIGURES = ("prefill_tok_s", "decode_tok_s", "throughput_tok_s", "ttft_s", "e2e_s",
                "ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "sim_throughput_tok_s")


@dataclass(frozen=True)
class SimulatedPrediction(Prediction):
    """The cost model's figures with the load the scheduler simulation gives at
    ``load_concurrency`` streams (``load_requests`` requests in all, each stream sending its
    next when its last ends)."""

    ttft_p50_s: float
    ttft_p90_s: float
    tpot_p50_s: float
    load_concurrency: int
    load_requests: int
    sim_throughput_tok_s: float  # the simulation's own aggregate, beside the closed formula's


@dataclass(frozen=True)
class RacedPrediction(SimulatedPrediction):
    """A :class:`SimulatedPrediction` whose TTFT p50 turns on a race (:data:`WAY_IN_SPREAD`):
    the span the p50 took with the way in at either end of the host's spread, seconds, (low,
    high), beside the planned figures (which it does not change). Only a plan where the race
    is found has it, so only its JSON has ``ttft_p50_range_s``."""

    ttft_p50_range_s: tuple[float, float]


@dataclass
class RooflineStep:
    """A scheduler step timed by the roofline's terms (:mod:`launcher.planner.costmodel`).

    A step of decoders only is :func:`costmodel.decode_step_s` at their mean context (the
    weights and their KV read, the step overhead, TP all-reduces, or the host's work for the
    sequences if longer); a step with prompt chunks is :func:`costmodel.prefill_step_s` of all
    its tokens (chunks and decoders together: one eager forward) whose attention spans the
    chunks' (query, key) pairs and each decoder's context, the host's floor counting the
    sequences that sample (every decoder, and the prompts whose last chunk it is). Steps of
    the same shape recur (the prompt chunks of a closed loop; the decode steps of each request
    of a stream, which reach the same contexts): each is timed once. A decode step is keyed by
    what it is timed from, its sequences and their mean context, not by their total context
    (the same mean from a few totals), nor by the prefill terms it has none of. A model with
    chunked-attention layers reads the requests' positions (``reads_spans``): those layers'
    keys are their queries' own chunk prefixes (costmodel.chunked_pairs), in the key too."""

    m: ModelSpec
    lay: Layout
    _seen: dict[tuple[int, float, int, int, int, float], float] = field(default_factory=dict,
                                                                        repr=False)

    @cached_property
    def reads_spans(self) -> bool:
        return self.m.chunked_layers > 0

    def step_s(self, batch: StepBatch) -> float:
        pre, pairs, seqs = batch.prefill_tokens, batch.prefill_pairs, batch.decode_seqs
        context, sampled = batch.decode_context, batch.sampled
        chunk = costmodel.chunked_pairs(self.m, batch.spans) if self.reads_spans else None
        if pre == 0:
            key = (0, 0.0, max(1, seqs), context // max(1, seqs), 0, chunk or 0.0)
        else:
            key = (pre, pairs, seqs, context, sampled, chunk or 0.0)
        found = self._seen.get(key)
        if found is None:
            found = self._seen[key] = (
                costmodel.decode_step_s(self.m, self.lay, key[2], key[3],
                                        chunk_keys=None if chunk is None else chunk / key[2])
                if pre == 0 else costmodel.prefill_step_s(
                    self.m, self.lay, pre + seqs, pairs=pairs + context, chunk_pairs=chunk,
                    sequences=max(1, sampled), sampled=sampled))
        return found

    @cached_property
    def layer_host(self) -> LayerHost:
        """The model's host work a layer, the same figure the step's host floor takes."""
        return costmodel.layer_host(self.m, self.lay.host)

    def launch_s(self, batch: StepBatch) -> float:
        """The host's launching of the step (a :class:`schedsim.LaunchTimer`), which the engine
        core does before it takes the step before's output, as the served engine's graphs
        (``lay.graphs``) run it (:meth:`LayerHost.launch_s` of the model's layer, family extras
        and all, as the step's own floor has it): past their range eagerly, each layer's
        kernels launched from Python, decoders only or not; within it a decode step's full
        graph at once, a prompt step's pieces with the attention between them."""
        return self.layer_host.launch_s(self.m.num_layers, self.lay.graphs,
                                        batch.prefill_tokens, batch.tokens)


def scheduler_limits(m: ModelSpec, f: Fit, max_num_seqs: int, tokens: int, *,
                     pp: int) -> SchedulerLimits:
    """The scheduler of a GPU replica of ``pp`` pipeline stages: the fit's batched-token
    budget, ``max_num_seqs``, and its KV pool (``f.kv_blocks``) in blocks of
    :data:`BLOCK_TOKENS` tokens of every layer. A pool block spans one layer of each group, so
    with sliding-window groups one request takes fewer than its tokens' blocks
    (:func:`memfit.request_blocks`): the pool is counted here in the simulation's blocks (a
    request of ``tokens`` takes ⌈tokens / 16⌉), scaled so that it holds as many such requests
    as the fit does (:func:`memfit.scheduler_blocks`). Asynchronous scheduling where vLLM has
    it by default, by the one rule every simulated engine follows
    (:func:`asyncsched.vllm_async_scheduling`; the served vLLM's release is not known to the
    planner: the one served here)."""
    blocks = memfit.scheduler_blocks(m, f.kv_blocks, tokens, f.limits.batched_tokens,
                                     f.kv_dtype_bytes)
    return SchedulerLimits(f.limits.batched_tokens, max_num_seqs, blocks, BLOCK_TOKENS,
                           async_scheduling=vllm_async_scheduling(gpu=True, pp=pp))


def loadgen_run(m: ModelSpec, lay: Layout, f: Fit, *, prompt: int, gen: int, streams: int,
                max_num_seqs: int, table: KernelTable | None = None, way_in: float = 1.0
                ) -> tuple[SchedulerLimits, SimResult]:
    """One replica's ``streams`` of loadgen's closed loop as it measures by default, through
    the simulated scheduler: the streams' requests sent at one moment, each stream sending its
    next one when its last ends, LOADGEN_REQUESTS_PER_STREAM in all (no prefix shared), so the
    later ones reach an engine that is decoding. Each request reaches the scheduler after the
    host profile's way in, the API server's loop taking a burst in stage by stage and handing
    the requests over one at a time in its last stage (input processing, IPC), so a burst
    reaches an idle engine core one request first, whose first token goes out once the loop is
    through the rest of the burst (schedsim._FrontEnd). Steps are timed by the roofline
    (:class:`RooflineStep`, which also gives each step's launch) or, with the kernel ``table``,
    as :mod:`kernelcost` times them; both under the served engine's CUDA graphs,
    ``lay.graphs``. ``way_in`` scales the whole way in (a host at another pace:
    :data:`WAY_IN_SPREAD`). Raises SimError where the workload cannot run."""
    lim = scheduler_limits(m, f, max_num_seqs, prompt + gen, pp=lay.pp)
    # the API server loop's work on each request's way in
    shared, serial = loop_split(way_in * (lay.host.request_s + prompt * lay.host.prompt_token_s))
    timer = (RooflineStep(m, lay) if table is None
             else layout_step(m, table, lay))
    return lim, simulate(
        lim, timer, Workload(prompt, gen, concurrency=streams,
                             requests=LOADGEN_REQUESTS_PER_STREAM * streams),
        request_overhead_s=way_in * (lay.host.request_fixed_s + prompt * lay.host.prompt_token_s),
        # the API server's loop takes a burst stage by stage, sharing itself among the requests
        # on it, and hands them to the engine core one after another in its last stage
        # (schedsim._FrontEnd, hardware.loop_split)
        request_shared_s=shared, request_serial_s=serial)


def under_load(m: ModelSpec, lay: Layout, f: Fit, pred: Prediction, *, prompt: int, gen: int,
               concurrency: int, max_num_seqs: int, table: KernelTable | None = None,
               look_for_race: bool = True) -> tuple[Prediction, tuple[str, ...]]:
    """``pred`` (the closed formulas') with the load of ``concurrency`` streams from the
    simulated scheduler, and the plan's line saying so; ``pred`` unchanged, with the reason,
    where the layout has pipeline stages or the workload cannot run. With the kernel ``table``
    the candidate was predicted from, its steps are timed as :mod:`kernelcost` times them
    (under the layout's CUDA graphs, ``lay.graphs``, as the roofline's are).
    ``look_for_race``: simulate again for the race of the way in (:func:`way_in_race`; False:
    the figures alone)."""
    host = (host_line(lay.host),
            costmodel.graph_kernel_line(lay.gpus))
    if lay.pp > 1:
        return pred, ("load at the requested concurrency: not simulated for pipeline-parallel "
                      "layouts (vLLM keeps a micro-batch per stage in flight, which the "
                      "step-by-step scheduler simulation does not represent); throughput from "
                      "the closed formula", *host)
    per_replica = max(1, -(-concurrency // lay.dp))
    try:
        lim, run = loadgen_run(m, lay, f, prompt=prompt, gen=gen, streams=per_replica,
                               max_num_seqs=max_num_seqs, table=table)
    except SimError as e:
        return pred, (f"load at the requested concurrency: not simulated ({e})", *host)
    requests = run.requests
    busy = min(lay.dp, -(-concurrency // per_replica))
    ttft = percentiles([r.ttft_s for r in requests])
    tpot = percentiles([r.tpot_s for r in requests])
    span = max(r.finished_s for r in requests) - min(r.sent_s for r in requests)
    out = SimulatedPrediction(
        **{k: getattr(pred, k) for k in Prediction.__dataclass_fields__},
        ttft_p50_s=ttft.p50, ttft_p90_s=ttft.p90, tpot_p50_s=tpot.p50,
        load_concurrency=concurrency, load_requests=busy * len(requests),
        sim_throughput_tok_s=busy * len(requests) * gen / span)
    race = (way_in_race(m, lay, f, prompt=prompt, gen=gen, streams=per_replica,
                        max_num_seqs=max_num_seqs, table=table, p50=ttft.p50)
            if look_for_race else None)
    if race is not None:
        out = RacedPrediction(**{k: getattr(out, k)
                                 for k in SimulatedPrediction.__dataclass_fields__},
                              ttft_p50_range_s=race)
    replicas = f" on each of {busy} replicas" if busy > 1 else ""
    source = "the roofline's terms" if table is None else "the measured kernel table"
    raced = () if race is None else (race_line(ttft.p50, race),)
    return out, (
        f"under load ({per_replica} stream(s) of {prompt}→{gen}{replicas}, each sending "
        f"{LOADGEN_REQUESTS_PER_STREAM} requests back to back as loadgen does), "
        f"from the simulated vLLM scheduler (budget {lim.max_num_batched_tokens} batched "
        f"tokens, chunked prefill, max_num_seqs {lim.max_num_seqs}, the fit's KV blocks; each "
        f"step timed by {source}): TTFT p50 {_ms(ttft.p50)}, p90 {_ms(ttft.p90)}; "
        f"TPOT p50 {_ms(tpot.p50)}{median_step([r.ttft_s for r in requests])}", *raced, *host)


def way_in_race(m: ModelSpec, lay: Layout, f: Fit, *, prompt: int, gen: int, streams: int,
                max_num_seqs: int, table: KernelTable | None, p50: float
                ) -> tuple[float, float] | None:
    """The TTFT p50's span, (low, high) seconds with ``p50`` among them (to 0.1 ms, as a
    plan's JSON keeps figures), where the run simulated again with its way in at either end of
    :data:`WAY_IN_SPREAD` gives TTFT p50s more than :data:`RACE_SHIFT` of ``p50`` apart, and
    waits in the engine for its first tokens as differently: the median of the requests' waits
    from the scheduler seeing them to the step that made their first token
    (RequestTiming.engine_ttft_s) moves as far. That wait leaves out the way in (and out)
    itself, which only scales with the host's pace (a small model's 32 streams move their p50
    by a tenth that way alone): what moves it is which steps the requests made. None where they
    do not, or where one stream sends (its next request reaches an idle engine: there is no
    step to make or miss). Two more runs of the one chosen layout, not of every candidate."""
    if streams < 2 or p50 <= 0:
        return None
    ends, waits = [], []
    for way_in in WAY_IN_SPREAD:
        try:
            _, run = loadgen_run(m, lay, f, prompt=prompt, gen=gen, streams=streams,
                                 max_num_seqs=max_num_seqs, table=table, way_in=way_in)
        except SimError:
            return None
        ends.append(percentiles([r.ttft_s for r in run.requests]).p50)
        waits.append(percentiles([r.engine_ttft_s for r in run.requests]).p50)
    if min(abs(ends[1] - ends[0]), abs(waits[1] - waits[0])) <= RACE_SHIFT * p50:
        return None
    return (round(min(p50, *ends), 4), round(max(p50, *ends), 4))


def race_line(p50: float, span: tuple[float, float]) -> str:
    """The plan's line on a TTFT p50 that turns on a race (:func:`way_in_race`)."""
    low, high = WAY_IN_SPREAD
    return (f"TTFT p50 {p50:.3f} s as planned; {span[0]:.3f}-{span[1]:.3f} s with the way in "
            f"x{low:.2f} - x{high:.2f} (the host's pace as engines kept it on the lent H200): "
            f"the p50 turns on whether a request reaches the scheduler before a step is chosen "
            f"(a race of a few ms)")


def median_step(values: list[float]) -> str:
    """Where the median sits on a step between waves, the span a run's median may land in
    (:data:`MEDIAN_SHIFT`), as a clause of the load line; "" where it is steady."""
    ordered = sorted(values)
    mid = percentile(ordered, 50)
    low, high = percentile(ordered, 50 - MEDIAN_SHIFT), percentile(ordered, 50 + MEDIAN_SHIFT)
    if mid <= 0 or high - low <= 2 * MEDIAN_STEP * mid:
        return ""
    return (f" (the TTFT p50 sits on a step between waves of first tokens: with "
            f"{MEDIAN_SHIFT:g}% of the requests on its other side it would be {_ms(low)} to "
            f"{_ms(high)})")


def host_line(host: HostProfile) -> str:
    """The plan's line on the host work its roofline figures include, and where it came from."""
    return (f"host work: a step at least {host.step_s * 1e3:.1f} ms + "
            f"{host.seq_step_s * 1e6:.0f} us per sequence (vLLM's front end beside the GPU; a "
            f"small model's decode is bound by it), a request {host.request_fixed_s * 1e3:.1f} ms "
            f"+ {host.prompt_token_s * 1e6:.1f} us per prompt token to its first token: "
            f"{host.source}")


def chosen_under_load(m: ModelSpec, policy: Policy, links: Links, topo: Topology,
                      c: Candidate) -> tuple[Candidate, tuple[str, ...]]:
    """The chosen candidate with its load at the policy's concurrency (the closed formulas
    rank every candidate; only the chosen one is simulated, which keeps `launcher plan` as fast
    as before), and the plan's line on it. Left as it is where its prediction came from a
    kernel table, its steps are timed by the table (its throughput stays kernelcost's own
    simulation's). Left as it is where it spans nodes or was not sized."""
    if c.predicted is None or c.fit is None or policy.nodes > 1:
        return c, ()
    lay = candidate_layout(c, topo, links, c.fit.kv_budget)
    pred, why = under_load(m, lay, c.fit, c.predicted, prompt=policy.prompt_tokens,
                           gen=policy.gen_tokens, concurrency=policy.streams,
                           max_num_seqs=policy.max_num_seqs, table=c.kernel_table)
    return replace(c, predicted=pred), why


def host_pace_span(m: ModelSpec, policy: Policy, topo: Topology, c: Candidate
                   ) -> tuple[dict[str, tuple[float, float]], tuple[str, ...]]:
    """Where the plan's host timing has an unsteady pace (:data:`PACE_FIGURES`' comment): the
    span of each figure of ``c`` (the chosen candidate, with its load) that moves between its
    planned prediction and the same layout predicted again with the host's terms at each end of
    the paces the host was seen at before the run (HostTiming.pace_ends: the fastest of the
    sampled fastest tenth and the rounds, the slowest of the rounds and the sampled pace; an end
    at the planned pace is the planned prediction), ``{figure: (low, high)}`` to 0.1 ms /
    0.0001 tok/s as the plan's JSON keeps figures, and the plan's line on the headline figures.
    ({}, ()) where the pace is steady (within UNSTEADY of 1, or no timing), the candidate was
    not sized, or the plan spans nodes. One or two more predictions of the one chosen layout,
    each load simulated once (without the race's two runs)."""
    timing = topo.host_timing
    if timing is None or c.predicted is None or c.fit is None or policy.nodes > 1:
        return {}, ()
    pace = timing.pace()
    if max(pace, 1 / pace) <= UNSTEADY:
        return {}, ()
    ends = []
    for end in timing.pace_ends():
        if end == pace:
            ends.append((end, c.predicted))
            continue
        other = _at_pace(m, policy, topo, c, timing, end)
        if other is None:
            return {}, ()
        ends.append((end, other))
    span = pace_span(c.predicted, *(p for _, p in ends))
    return span, ((pace_line(pace, c.predicted, ends),) if span else ())


def _at_pace(m: ModelSpec, policy: Policy, topo: Topology, c: Candidate, timing: HostTiming,
             pace: float) -> Prediction | None:
    """``c``'s layout predicted again, its load simulated once, with the host's timed terms at
    ``pace`` (None where the layout no longer sizes)."""
    links = Links(topo, policy.cuda_graphs, host=hardware.host_profile(timing, pace=pace))
    by_index = {g.index: g for g in topo.gpus}
    size = c.tp * c.pp
    groups = [tuple(by_index[i] for i in c.gpus[k:k + size])
              for k in range(0, len(c.gpus), size)]
    again, lay = evaluate(m, policy, links, groups, Shape(c.tp, c.pp, c.dp), None)
    if lay is None or again.predicted is None or again.fit is None:
        return None
    other, _ = under_load(m, lay, again.fit, again.predicted, prompt=policy.prompt_tokens,
                          gen=policy.gen_tokens, concurrency=policy.streams,
                          max_num_seqs=policy.max_num_seqs, table=again.kernel_table,
                          look_for_race=False)
    return other


def pace_span(planned: Prediction, *others: Prediction) -> dict[str, tuple[float, float]]:
    """Each of :data:`PACE_FIGURES` all the predictions have that differs between them (to the
    4 decimals a plan's JSON keeps): (low, high) over them all, the planned figure included."""
    out = {}
    for name in PACE_FIGURES:
        got = [x for p in (planned, *others) if isinstance(x := getattr(p, name, None), float)]
        if len(got) == 1 + len(others) and len({round(x, 4) for x in got}) > 1:
            out[name] = (round(min(got), 4), round(max(got), 4))
    return out


def pace_line(pace: float, planned: Prediction, ends: list[tuple[float, Prediction]]) -> str:
    """The plan's line on the headline figures at the fastest and slowest paces the host was
    seen at (``ends``: (pace, prediction) fast then slow)."""
    def tok(p: Prediction, name: str) -> str:
        value = float(getattr(p, name))
        return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"

    def ms(p: Prediction, name: str) -> str:
        value = float(getattr(p, name)) * 1e3
        return f"{value:.0f}" if value >= 100 else f"{value:.1f}"

    preds = [planned, *(p for _, p in ends)]

    def each(show: Callable[[Prediction, str], str], name: str) -> str:
        first, *rest = (show(p, name) for p in preds)
        return f"{first} → {' / '.join(rest)}"

    parts = [f"{what} {each(tok, name)} tok/s"
             for what, name in (("prefill", "prefill_tok_s"), ("decode", "decode_tok_s"),
                                ("throughput", "throughput_tok_s"))]
    if all(isinstance(p, SimulatedPrediction) for p in preds):
        parts += [f"{what} {each(ms, name)} ms"
                  for what, name in (("TTFT p50", "ttft_p50_s"), ("TPOT p50", "tpot_p50_s"))]
    (fast, _), (slow, _) = ends
    return (f"host pace: the host's work planned at x{pace:.2f} its timed rounds' (the pace a "
            f"running thread kept here); an engine may keep another, between the fastest this "
            f"host was seen at before the run (x{fast:.2f}, the least of the sampled fastest "
            f"tenth and the rounds) and the slowest (x{slow:.2f}, the greater of the rounds and "
            f"the sampled pace), where this layout gives (as planned → at x{fast:.2f} / at "
            f"x{slow:.2f}): {', '.join(parts)}; the planned figures stand, and the plan's "
            f"predicted.host_pace_range gives each figure's span")


def _ms(s: float) -> str:
    return f"{s * 1e3:.0f} ms" if s < 10 else f"{s:.1f} s"
