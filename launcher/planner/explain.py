"""What the planner says: link settings with their reasons, descriptions, the no-fit error."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from launcher.errors import PlanError
from launcher.model import families
from launcher.model.modelspec import GIB, ModelSpec
from launcher.planner import hardware, memfit, whatif
from launcher.planner.layouts import Links
from launcher.planner.plantypes import (
    MIN_CONTEXT,
    Candidate,
    EngineSettings,
    Policy,
    gib,
    label,
    shape_label,
)
from launcher.planner.tablegaps import ROOFLINE_NOTE
from launcher.probe.kernels import KernelTable
from launcher.probe.topology import ANCESTOR_RANK, Topology

# ------------------------------------------------------------------------------ the settings


def _tp_pairs(topo: Topology, cand: Candidate) -> list[tuple[int, int]]:
    """GPU pairs that share an all-reduce (same replica, same stage)."""
    g, out = cand.gpus, []
    for start in range(0, len(g), cand.tp):
        grp = g[start : start + cand.tp]
        out += [(a, b) for i, a in enumerate(grp) for b in grp[i + 1 :]]
    return out


def settings(topo: Topology, cand: Candidate, m: ModelSpec
             ) -> tuple[dict[str, str], EngineSettings, list[str]]:
    """Environment and vLLM settings the chosen layout needs on these links, and the hybrid
    KV-cache manager ``m``'s context was sized with (memfit.hybrid_kv_pin: Llama 4's chunked
    layers), each with its reason."""
    env: dict[str, str] = {}
    no_custom_all_reduce = False
    why: list[str] = []
    pairs = [topo.pair(a, b) for a, b in _tp_pairs(topo, cand)]
    if cand.tp > 1 and cand.transport == "shm":
        no_custom_all_reduce = True
        why.append(
            "--disable-custom-all-reduce: no P2P between the TP GPUs, and vLLM's custom "
            "all-reduce needs CUDA IPC between them; NCCL goes through host memory (SHM)"
        )
    elif cand.tp > 2 and not all(p.nvlinks > 0 for p in pairs):
        no_custom_all_reduce = True
        why.append(
            f"--disable-custom-all-reduce: TP={cand.tp} without NVLink between every pair; "
            "vLLM's custom all-reduce only works there on full NVLink"
        )
    if cand.transport == "p2p-pcie" and pairs:
        worst = max(
            (p.common_ancestor or "SYS" for p in pairs), key=lambda a: ANCESTOR_RANK.get(a, 5)
        )
        if ANCESTOR_RANK.get(worst, 5) > ANCESTOR_RANK["PXB"]:
            env["NCCL_P2P_LEVEL"] = worst
            why.append(
                f"NCCL_P2P_LEVEL={worst}: NVML grants P2P but the GPUs meet at {worst}, "
                "past the PXB limit of NCCL's default (it would fall back to SHM)"
            )
        gpus = {g.index: g for g in topo.gpus}
        if any(
            hardware.gpu_model(gpus[i].name, gpus[i].cc).geforce for i in cand.gpus if i in gpus
        ):
            env["VLLM_SKIP_P2P_CHECK"] = "0"
            why.append(
                "VLLM_SKIP_P2P_CHECK=0: GeForce cards with P2P granted (patched driver): "
                "let vLLM verify that peer copies really arrive before trusting them"
            )
    pinned, pin_why = memfit.hybrid_kv_pin(m, cand.max_model_len or 0)
    return ({**env, **pinned}, EngineSettings(disable_custom_all_reduce=no_custom_all_reduce),
            [*why, *pin_why])


# ------------------------------------------------------------------------------------ reasons


def describe_topology(topo: Topology, links: Links, used: Sequence[int]) -> list[str]:
    """The machine's GPUs and links; ``used``: the GPUs of the chosen plan."""
    names: dict[str, int] = {}
    for g in topo.gpus:
        names[g.name] = names.get(g.name, 0) + 1
    out = [
        ", ".join(f"{n}× {name}" for name, n in names.items())
        + " ("
        + ", ".join(f"GPU{g.index} {gib(g.memory_bytes)} GiB" for g in topo.gpus)
        + ")"
    ]
    for a, b in itertools.combinations(topo.gpus, 2):
        link = links.between(a, b)
        pair = topo.pair(a.index, b.index)
        what = f"NV{pair.nvlinks}" if link.transport == "nvlink" else (pair.common_ancestor or "?")
        out.append(
            f"GPU{a.index}-GPU{b.index}: {link.transport} ({what}), ~{link.gbs:.1f} GB/s "
            f"{'measured' if pair.measured and pair.measured.bandwidth_gbs else 'assumed'}"
        )
    if len({g.name for g in topo.gpus if g.index in used}) > 1:
        out.append(
            "mixed GPU models: every worker is sized to the smallest card's memory and runs "
            "at the slowest card's speed"
        )
    unused = [g for g in topo.gpus if g.index not in used]
    if unused:
        why = []
        if any(g.mig_enabled for g in unused):
            why.append("a card in MIG mode is its slices to CUDA: turn MIG off to use it")
        if any(not g.mig_enabled for g in unused):
            why.append("the rejected layouts below say why")
        left = ", ".join(f"GPU{g.index} ({g.name}{', in MIG mode' if g.mig_enabled else ''})"
                         for g in unused)
        out.append(f"not used by this plan: {left} ({'; '.join(why)})")
    return out


def describe_model(m: ModelSpec) -> str:
    q = f"{m.quantization} {m.weight_bits:g}-bit" if m.quantization else m.dtype
    window = (
        f", {m.sliding_layers} sliding-window layers ({m.sliding_window} tokens)"
        if m.sliding_layers
        else ""
    ) + (
        f", {m.chunked_layers} chunked-attention layers ({m.attention_chunk}-token chunks)"
        if m.chunked_layers
        else ""
    )
    moe = (
        f", {m.num_experts} experts (top {m.experts_per_token}), "
        f"{m.active_params / 1e9:.1f}B active"
        if m.num_experts
        else ""
    )
    return (
        f"{m.name}: {m.params / 1e9:.1f}B parameters{moe}, {gib(m.weight_bytes)} GiB of weights "
        f"({q}), KV {m.kv_bytes(8192) / 8192 / 1024:.0f} KiB/token at 8k tokens{window}"
    )


def describe_choice(c: Candidate, cands: Sequence[Candidate], policy: Policy) -> list[str]:
    """Why ``c`` won, with its one-request time for the request shape the policy asked for
    (the prediction is made for it)."""
    assert c.predicted is not None
    p = c.predicted
    streams = policy.streams
    out = [
        f"{label(c)} chosen for {policy.workload} (concurrency {streams}): "
        f"prefill {p.prefill_tok_s:.0f} tok/s, decode {p.decode_tok_s:.1f} tok/s, "
        f"{p.e2e_s:.1f} s for {policy.prompt_tokens}→{policy.gen_tokens}, "
        f"{p.throughput_tok_s:.0f} tok/s "
        f"over {streams} stream(s)"
    ]
    for o in cands:
        if o is c or o.predicted is None or o.scores is None:
            continue
        out.append(
            f"  vs {label(o)}: interactive {o.scores.interactive:.2f}, throughput "
            f"{o.scores.throughput:.2f} (prefill {o.predicted.prefill_tok_s:.0f}, decode "
            f"{o.predicted.decode_tok_s:.1f}, {o.predicted.throughput_tok_s:.0f} tok/s)"
        )
    return out


def describe_speed_source(table: KernelTable | None) -> tuple[str, ...]:
    """The plan's line on the kernel table its chosen candidate was predicted from (none when
    the roofline predicted: the plan's other reasons say what that assumed)."""
    if table is None:
        return ()
    return (f"speed from this model's kernel table, measured {table.measured_at} on "
            f"{table.key.device} ({table.method}), through a simulation of vLLM's scheduler; "
            f"engine step overhead {'measured' if table.engine_step_s is not None else 'assumed'}"
            + "".join(f"; {n}" for n in table.notes if n.startswith(ROOFLINE_NOTE)),)


def user_memory_flags(policy: Policy, m: ModelSpec) -> list[str]:
    """What the user's own vLLM flags changed in the sizing, said as such."""
    out = []
    if policy.fp8_weights and m.quantization == "fp8":
        out.append(f"--quantization fp8 (your vLLM flag): weights quantized to FP8 at load, "
                   f"{m.weight_bytes / GIB:.1f} GiB")
    asked = m.kv_cache_quantized == 1 and not policy.kv_cache_given
    auto = families.vllm_auto_kv_bytes(policy.vllm.release, m.kv_cache_quantized)
    if asked and policy.kv_cache_bytes == 1 and auto == 1:
        out.append(f"FP8 KV cache: the checkpoint's quantization config asks for one, which vLLM "
                   f"{policy.vllm.version} takes under --kv-cache-dtype auto: one byte per KV "
                   "element, twice the context in the same memory")
    elif policy.kv_cache_bytes == 1:
        out.append("--kv-cache-dtype fp8 (your vLLM flag): one byte per KV element, twice the "
                   "context in the same memory")
    elif asked and auto is None:
        served = (f"vLLM {policy.vllm.version}" if policy.vllm.version
                  else "the served vLLM") + f" ({policy.vllm.read_from})"
        out.append("KV cache at 2 bytes per element: the checkpoint's quantization config asks "
                   f"for an FP8 KV cache, but whether {served} takes it under --kv-cache-dtype "
                   "auto is not known (the rule was read for vLLM "
                   f"{', '.join('.'.join(map(str, r)) for r in sorted(families.AUTO_KV_RULES))}); "
                   "passing --kv-cache-dtype fp8 (after --) would double the context")
    if policy.cpu_offload_gib:
        out.append(f"--cpu-offload-gb {policy.cpu_offload_gib:g} (your vLLM flag): that much "
                   "of each GPU's weights stays in CPU memory and crosses PCIe at every step; "
                   "the speeds above do not include that")
    return out


def graph_rule(policy: Policy) -> list[str]:
    """The served vLLM's CUDA-graph rule where the plan assumes it (families.graph_rule_note:
    its release not read, or not one whose rule is known); nothing without graphs."""
    note = families.graph_rule_note(policy.vllm)
    return [note] if note and policy.graph_tokens != 0 else []


def describe_plan(topo: Topology, links: Links, m: ModelSpec, policy: Policy, chosen: Candidate,
                  cands: Sequence[Candidate], why: Sequence[str],
                  node_note: Sequence[str]) -> tuple[str, ...]:
    """A GPU plan's reasons, from the chosen candidate and the others as the search left them:
    the machine, the model, the choice, the settings' ``why``, the user's memory flags, a
    lowered utilization, the nodes (``node_note``: multinode.per_node_note), the speed source,
    the rejected layouts and the context."""
    out = [*why, *user_memory_flags(policy, m), *graph_rule(policy)]
    if chosen.gpu_memory_utilization < policy.gpu_memory_utilization:
        out.append(
            f"--gpu-memory-utilization {chosen.gpu_memory_utilization:g} instead of "
            f"{policy.gpu_memory_utilization:g}: other processes hold "
            f"{', '.join(h.describe() for h in chosen.held)} (a desktop, "
            "another engine?), and vLLM starts only if that share of each GPU is free; "
            "free them to get the rest"
        )
    if policy.nodes > 1:
        out.append(
            f"{policy.nodes} nodes: TP={chosen.tp} inside each node, PP={chosen.pp} stages, "
            f"{policy.nodes - 1} of the hops over the network (~{policy.internode_gbs:.0f} GB/s "
            "assumed); vLLM's own multi-node executor (serve --node-rank --master-addr), or Ray "
            "with --ray-address"
        )
        out += node_note
    rejected = [
        f"rejected {label(c) if c.gpus else shape_label(c)}: {c.rejected}"
        for c in cands
        if c.rejected
    ]
    assert chosen.max_model_len is not None
    return (
        *describe_topology(topo, links, chosen.gpus),
        *topo.notes,
        describe_model(m),
        *m.notes,
        *describe_choice(chosen, cands, policy),
        *out,
        *describe_speed_source(chosen.kernel_table),
        *rejected,
        f"max_model_len {chosen.max_model_len}: "
        + (
            "asked for"
            if policy.max_model_len
            else "the model's own limit, which the KV cache holds"
            if chosen.max_model_len >= m.max_position_embeddings
            else "the longest context the estimated KV cache holds, less "
            + context_margin(chosen)
        ),
    )


def context_margin(chosen: Candidate) -> str:
    """The margin the planned context keeps below the estimate, in words (memfit.kept_back)."""
    assert chosen.fit is not None
    kept = memfit.kept_back(chosen.fit.kv_budget, chosen.fit.cushion)
    share = kept / chosen.fit.kv_budget if chosen.fit.kv_budget else 0.0
    bound = ("" if kept < chosen.fit.cushion
             else ", the bytes of the estimate's activation, CUDA-graph and non-torch terms")
    return (f"a margin of {kept / GIB:.2f} GiB ({share:.1%} of it{bound}; vLLM's own sizing may "
            "differ by a few percent)")


# ----------------------------------------------------------------------------------- no fit


def no_fit(topo: Topology, m: ModelSpec, policy: Policy, cands: Sequence[Candidate]) -> PlanError:
    """GiB needed against GiB available, and what would fit, each with its context length
    (read from each candidate's own fit)."""
    sized = [c for c in cands if c.budget_gib > 0]
    if not sized:
        why = "; ".join(sorted({c.rejected or "" for c in cands}))
        return PlanError(f"{m.name}: no layout of it is valid on {len(topo.gpus)} GPU(s): {why}")
    biggest = min(sized, key=lambda c: c.need_gib - c.budget_gib)
    wanted = policy.max_model_len or min(MIN_CONTEXT, m.max_position_embeddings)
    n = len(biggest.gpus)
    msg = (
        f"{m.name} does not fit: {label(biggest)} needs {biggest.need_gib} GiB per GPU "
        f"({gib(m.weight_bytes)} GiB of weights in all, KV for {wanted} tokens), "
        f"has {biggest.budget_gib} GiB per GPU "
        f"({n} × {biggest.budget_gib} = {n * biggest.budget_gib:.1f} GiB)"
    )
    util = biggest.gpu_memory_utilization
    if util < policy.gpu_memory_utilization:
        gpus = [g for g in topo.gpus if g.index in biggest.gpus]
        msg += (
            f", at --gpu-memory-utilization {util:g}: other processes hold "
            f"{', '.join(h.describe() for h in biggest.held)}; with that freed, "
            f"{policy.gpu_memory_utilization:g} would give "
            f"{gib(min(g.memory_bytes for g in gpus) * policy.gpu_memory_utilization)} GiB per GPU"
        )
    fixes = whatif.say(
        whatif.options(m, topo.gpus, biggest, util, wanted, policy.kv_cache_bytes,
                       graphs=policy.cuda_graphs), wanted)
    rooms = [(c.fit.context if c.fit.kv_budget > 0 else 0, c) for c in sized if c.fit]
    shorter, c = max(rooms, key=lambda rc: rc[0], default=(0, biggest))
    if shorter >= 256:
        fixes.append(f"a shorter context, --max-model-len {shorter} ({label(c)})")
    if not fixes:
        return PlanError(msg + ". Nothing toposerve knows of would fit on these GPUs")
    return PlanError(msg + ". Would fit: " + "; or ".join(fixes))
