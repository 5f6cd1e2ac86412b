"""The planner: every layout of the model on these GPUs, sized, predicted and scored. Pure.

``plan(topology, model, policy) -> Plan`` enumerates one GPU, tensor parallel (TP), pipeline
parallel (PP, "layer split"), TP×PP and data-parallel replicas (DP), rejects what cannot run
(with the reason), predicts each survivor with :mod:`launcher.planner.costmodel`, scores it for both
workloads and keeps the best for the one asked. No NVML, environment, clock or logging here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from launcher.errors import PlanError
from launcher.model.modelspec import GIB, ModelSpec
from launcher.planner import costmodel, hardware, kernelcost, loadsim, memfit, whatif
from launcher.planner.explain import describe_model, describe_plan, no_fit, settings
from launcher.planner.layouts import Links, Shape, best_candidate, shapes, structural_reject
from launcher.planner.multinode import multinode_candidates, per_node_note
from launcher.planner.plantypes import (
    CPU_KV_CACHE_GIB,
    CPU_KV_ENV,
    MIN_CONTEXT,
    WORKLOADS,
    Candidate,
    Plan,
    Policy,
    Scores,
    mode_name,
)
from launcher.probe.topology import Gpu, Topology

__all__ = ["MIN_CONTEXT", "WORKLOADS", "Candidate", "Plan", "Policy", "Scores", "mode_name", "plan"]

TIE = 0.03  # scores this close are a tie, broken by fewer GPUs, then the other workload


def _with_scores(cands: Sequence[Candidate]) -> list[Candidate]:
    ok = [c.predicted for c in cands if c.predicted is not None]
    if not ok:
        return list(cands)
    best_e2e = min(p.e2e_s for p in ok)
    best_tput = max(p.throughput_tok_s for p in ok)
    return [
        c
        if c.predicted is None
        else replace(
            c,
            scores=Scores(
                interactive=round(best_e2e / c.predicted.e2e_s, 3),
                throughput=round(c.predicted.throughput_tok_s / best_tput, 3),
            ),
        )
        for c in cands
    ]


def _choose(cands: Sequence[Candidate], workload: str) -> Candidate:
    ok = [c for c in cands if c.scores is not None]
    first, second = (
        ("interactive", "throughput")
        if workload == "interactive"
        else ("throughput", "interactive")
    )

    def score(c: Candidate, w: str) -> float:
        assert c.scores is not None
        return float(getattr(c.scores, w))

    top = max(score(c, first) for c in ok)
    close = [c for c in ok if score(c, first) >= top - TIE]
    return max(close, key=lambda c: (-len(c.gpus), score(c, second), score(c, first)))


# ------------------------------------------------------------------------------------- plan()


def _check_policy(m: ModelSpec, policy: Policy) -> None:
    if policy.workload not in WORKLOADS:
        raise PlanError(f"unknown workload {policy.workload!r}; use one of {', '.join(WORKLOADS)}")
    if not 0.05 <= policy.gpu_memory_utilization <= 1.0:
        raise PlanError("--gpu-memory-utilization must lie between 0.05 and 1.0")
    if policy.max_model_len and policy.max_model_len > m.max_position_embeddings:
        raise PlanError(
            f"--max-model-len {policy.max_model_len} exceeds {m.name}'s "
            f"max_position_embeddings {m.max_position_embeddings}; ask for at most that"
        )


@dataclass(frozen=True)
class CpuKv:
    """The CPU engine's KV cache (VLLM_CPU_KVCACHE_SPACE) and the context it holds."""

    gib: float  # whole GiB unless the user's own: vLLM reads the variable with int()
    context: int  # memfit.cpu_context of it, or the length asked for
    why: tuple[str, ...] = ()  # a reason line where the default was not kept


def cpu_wanted_context(m: ModelSpec, policy: Policy) -> int:
    """The context a CPU plan's KV cache must hold: MIN_CONTEXT, or a whole asked request where
    that is longer, never past the model's positions; an asked --max-model-len shorter than
    that instead. A longer asked length is passed through as asked (vLLM's own check refuses
    it and `launcher serve` starts again at the length vLLM names), not sized for."""
    useful = max(MIN_CONTEXT, policy.prompt_tokens + policy.gen_tokens)
    if policy.max_model_len:
        useful = min(useful, policy.max_model_len)
    return max(1, min(useful, m.max_position_embeddings))


def cpu_kv_space(m: ModelSpec, policy: Policy, topo: Topology, nodes: int = 1) -> CpuKv:
    """The CPU engine's KV cache for ``m``: the user's VLLM_CPU_KVCACHE_SPACE where set, else
    CPU_KV_CACHE_GIB where that holds :func:`cpu_wanted_context` (a hybrid's recurrent state
    per sequence included), else the whole GiB that do. Refused (PlanError, one line) where
    the cache holds less, or where the host's free memory (``topo.host_available_bytes``, when
    known) cannot take this node's share of the weights, the engine's own peak and a cache per
    worker. ``nodes``: the machines the layer stages are spread over (one worker per stage)."""
    wanted = cpu_wanted_context(m, policy)
    need = memfit.cpu_kv_holding(m, wanted)
    sized = max(CPU_KV_CACHE_GIB, float(math.ceil(need / GIB)))
    asked = policy.cpu_kv_cache_gib
    gib_ = sized if asked is None else asked
    context = memfit.cpu_context(m, gib_ * GIB)
    if asked is not None and context < wanted:  # a cache the plan sizes holds it
        raise PlanError(
            f"VLLM_CPU_KVCACHE_SPACE={asked:g} holds {context:,} tokens of {m.name} on the CPU "
            f"engine ({_kv_said(m)}), fewer than the {wanted:,} wanted: set it to {sized:g} "
            "(GiB of host memory), or unset it and the plan sizes it")
    workers = max(1, (policy.force_tp or 1) * (policy.force_pp or 1) // nodes)
    weights = memfit.held_weight_bytes(m) / nodes
    engine = memfit.cpu_engine_bytes(m)
    total = weights + engine + workers * gib_ * GIB
    have = topo.host_available_bytes
    if have is not None and total > have:
        raise PlanError(
            f"{m.name} on the CPU engine needs {total / GIB:.1f} GiB of host memory "
            f"({weights / GIB:.1f} GiB of weights, {workers * gib_:g} GiB of KV cache for a "
            f"{wanted:,}-token context ({_kv_said(m)}), {engine / GIB:.1f} GiB of activations) "
            f"and {have / GIB:.1f} GiB is free: serve a smaller or quantized model, free or add "
            "RAM, or serve it on a GPU")
    why: tuple[str, ...] = ()
    if asked is None and sized > CPU_KV_CACHE_GIB:
        host = ("host memory free not known" if have is None else
                f"{total / GIB:.1f} of the host's {have / GIB:.1f} GiB free with the weights")
        why = (f"CPU KV cache raised to VLLM_CPU_KVCACHE_SPACE={sized:g} ({CPU_KV_CACHE_GIB:g} "
               f"GiB would hold {memfit.cpu_context(m, CPU_KV_CACHE_GIB * GIB):,} tokens, "
               f"fewer than the {wanted:,} wanted; {_kv_said(m)}): {host}",)
    return CpuKv(gib_, policy.max_model_len or context, why)


def _kv_said(m: ModelSpec) -> str:
    """A model's KV need in a few words: its recurrent state per sequence where it has one."""
    state = memfit.request_kv_bytes(m, 1, memfit.CPU_BATCHED_TOKENS,
                                    block=memfit.CPU_BLOCK_TOKENS,
                                    in_flight=memfit.CPU_BATCHES_IN_FLIGHT)
    return (f"{state / GIB:.2f} GiB a sequence before its first token" if m.recurrent_layers
            else f"{memfit.cpu_kv_holding(m, MIN_CONTEXT) / GIB:.2f} GiB for "
            f"{MIN_CONTEXT:,} tokens")


def _cpu_plan(m: ModelSpec, policy: Policy, topo: Topology, nodes: int = 1) -> Plan:
    # A split asked for on the CPU engine runs as that many CPU worker processes (layer stages
    # over Ray's nodes when --ray-address is given); replicas are not offered on the CPU.
    tp, pp = policy.force_tp or 1, policy.force_pp or 1
    why = structural_reject(m, Shape(tp, pp, 1))
    if why:
        raise PlanError(f"{why.reason}; ask for a split the model allows")
    kv = cpu_kv_space(m, policy, topo, nodes)
    context = kv.context
    over = costmodel.cpu_step_overhead(topo.engine_step, policy.cpu_cores)
    pred = costmodel.predict_cpu(
        m,
        policy.cpu_cores,
        prompt=policy.prompt_tokens,
        gen=policy.gen_tokens,
        concurrency=policy.streams,
        step_overhead_s=over.seconds,
        prefill=over.prefill,
        seq_s=over.seq_s,
    )
    measured = kernelcost.cpu_prediction(
        m, policy.kernels, kv_bytes=kv.gib * GIB, prompt=policy.prompt_tokens,
        gen=policy.gen_tokens, concurrency=policy.streams, step_overhead=over,
    )
    if measured is not None:
        pred = measured[0]
    split = [
        f"TP={tp} PP={pp} as asked: {tp * pp} CPU worker processes; the prediction is "
        "for one worker (the split is not modelled on the CPU)"
    ] if tp * pp > 1 else []
    cand = Candidate(
        mode_name(tp, pp, 1),
        tp,
        pp,
        1,
        (),
        "none",
        predicted=pred,
        scores=Scores(1.0, 1.0),
        max_model_len=context,
    )
    reasons = (
        "no GPU found: CPU engine, 1 replica",
        *topo.notes,
        describe_model(m),
        (f"predicted from this CPU's kernel table ({'; '.join(measured[1])}): "
         if measured is not None else
         # a timed engine step is what the figures stand on (the next line says what was
         # timed); the assumed bandwidth stays for the planned model's own weight reads
         f"predicted on {policy.cpu_cores} CPU cores from the engine timed on this machine "
         f"(the model's weight reads at an assumed {hardware.CPU_MEM_GBS:g} GB/s): "
         if over.measured else
         f"predicted on {policy.cpu_cores} CPU cores at an assumed {hardware.CPU_MEM_GBS:g} GB/s "
         "of DRAM bandwidth: ")
        + f"prefill {pred.prefill_tok_s:.0f} tok/s, decode {pred.decode_tok_s:.1f} tok/s",
        *(() if measured is not None else (over.why,)),
        *kv.why,
        *split,
    )
    return Plan(
        mode=mode_name(tp, pp, 1),
        tp=tp,
        pp=pp,
        dp=1,
        gpus=(),
        engine="cpu",
        transport="none",
        predicted=pred,
        reasons=reasons,
        candidates=(cand,),
        max_model_len=context,
        model=m.name,
        family=m.family,
        workload=policy.workload,
        gpu_memory_utilization=policy.gpu_memory_utilization,
        # the cache the context was sized for: render gives the engine this one
        env={CPU_KV_ENV: f"{kv.gib:g}"},
    )


def _best_on_one_node(
    model: ModelSpec, policy: Policy, links: Links, usable: Sequence[Gpu]
) -> Candidate | None:
    """The layout one node would be given on its own (what replicas per node would run), from
    the same search, without planning again; None where nothing fits one node."""
    one = replace(policy, nodes=1, gpus_per_node=None, force_tp=None, force_pp=None,
                  force_dp=None)
    cands = _with_scores([best_candidate(model, one, links, usable, s)[0]
                          for s in shapes(len(usable), one)])
    return _choose(cands, one.workload) if any(c.predicted for c in cands) else None


def plan(topology: Topology, model: ModelSpec, policy: Policy | None = None) -> Plan:
    """The best layout of ``model`` on ``topology`` for ``policy``, with every candidate and reason.

    Raises PlanError (with GiB needed against GiB available and what would fit) when none fits.
    """
    policy = policy or Policy()
    _check_policy(model, policy)
    if policy.fp8_weights and model.weight_bits > 8 and topology.gpus:
        # vLLM's --quantization fp8 quantizes a 16-bit checkpoint's linear layers at load
        model = replace(whatif.variant(model, 8.0), quantization="fp8")
    if not topology.gpus:
        nodes = policy.nodes
        if nodes > 1:
            # CPU nodes: one engine process per node, so the layer stages are the nodes.
            policy = replace(policy, force_pp=policy.force_pp or nodes, nodes=1)
        return _cpu_plan(model, policy, topology, nodes)
    # A card in MIG mode is its slices to CUDA, and NCCL joins none: vLLM cannot use it whole.
    usable = [g for g in topology.gpus if not g.mig_enabled]
    if not usable:
        raise PlanError(
            "every GPU is in MIG mode, which vLLM cannot split a model over: turn MIG off "
            "(`sudo nvidia-smi -i 0 -mig 0`, for each GPU, then reset it) or serve one MIG slice "
            "by hand (CUDA_VISIBLE_DEVICES=MIG-<uuid>)"
        )
    links = Links(topology, policy.cuda_graphs)
    if policy.nodes > 1:
        # the best layout on one node first (the same search), for replicas per node against
        # the split over nodes
        one = _best_on_one_node(model, policy, links, usable)
        cands = multinode_candidates(topology, model, policy, links)
        node_note = per_node_note(model, policy, one)
    else:
        cands = [
            best_candidate(model, policy, links, usable, s)[0]
            for s in shapes(len(usable), policy)
        ]
        node_note = []
    cands = _with_scores(cands)
    if not any(c.predicted for c in cands):
        raise no_fit(topology, model, policy, cands)
    picked = _choose(cands, policy.workload)
    # the chosen layout's load at the asked concurrency, through the simulated scheduler
    chosen, load = loadsim.chosen_under_load(model, policy, links, topology, picked)
    cands = [chosen if c is picked else c for c in cands]
    # the chosen layout at the host timing's rounds' speed, where its pace is unsteady
    pace_range, paced = loadsim.host_pace_span(model, policy, topology, chosen)
    env, engine_settings, why = settings(topology, chosen, model)
    if policy.nodes > 1:
        engine_settings = replace(engine_settings, distributed_backend="ray")
    reasons = (*describe_plan(topology, links, model, policy, chosen, cands, why, node_note),
               *load, *paced)
    assert chosen.predicted is not None
    assert chosen.max_model_len is not None
    return Plan(
        mode=chosen.mode,
        tp=chosen.tp,
        pp=chosen.pp,
        dp=chosen.dp,
        gpus=chosen.gpus,
        engine="gpu",
        transport=chosen.transport,
        predicted=chosen.predicted,
        reasons=reasons,
        candidates=tuple(cands),
        max_model_len=chosen.max_model_len,
        model=model.name,
        family=model.family,
        workload=policy.workload,
        gpu_memory_utilization=chosen.gpu_memory_utilization,
        nodes=policy.nodes,
        env=env,
        settings=engine_settings,
        host_pace_range=pace_range,
    )
