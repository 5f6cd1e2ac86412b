"""The planner: every layout of the model on these GPUs, sized, predicted and scored. Pure.

``plan(topology, model, policy) -> Plan`` enumerates one GPU, tensor parallel (TP), pipeline
parallel (PP, "layer split"), TP×PP and data-parallel replicas (DP), rejects what cannot run
(with the reason), predicts each survivor with :mod:`launcher.costmodel`, scores it for both
workloads and keeps the best for the one asked. No NVML, environment, clock or logging here.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from launcher import costmodel, hardware
from launcher.costmodel import Layout, Link, Prediction
from launcher.errors import PlanError
from launcher.modelspec import GIB, ModelSpec
from launcher.topology import ANCESTOR_RANK, Gpu, Topology

WORKLOADS = ("interactive", "throughput")
MIN_CONTEXT = 4096  # below this a coding agent cannot work; shorter only when asked for
BASE_OVERHEAD_BYTES = 1.0 * GIB  # CUDA context, cuBLAS workspace, CUDA graphs
PARALLEL_OVERHEAD_BYTES = 0.25 * GIB  # NCCL buffers and the custom all-reduce's IPC buffers
BATCHED_TOKENS = 2048  # vLLM's default max_num_batched_tokens with chunked prefill
TIE = 0.03  # scores this close are a tie, broken by fewer GPUs, then the other workload


@dataclass(frozen=True)
class Policy:
    workload: str = "interactive"
    concurrency: int | None = None  # streams to expect; default 1 (interactive) / 32 (throughput)
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.9
    force_tp: int | None = None
    force_pp: int | None = None
    force_dp: int | None = None
    nodes: int = 1
    gpus_per_node: int | None = None
    prompt_tokens: int = 512
    gen_tokens: int = 256
    max_num_seqs: int = 256
    internode_gbs: float = hardware.DEFAULT_INTERNODE_GBS
    cpu_cores: int = 4  # CPU engine only

    @property
    def streams(self) -> int:
        if self.concurrency is not None:
            return max(1, self.concurrency)
        return 1 if self.workload == "interactive" else 32


@dataclass(frozen=True)
class Scores:
    interactive: float  # 1.0 = the fastest end-to-end single request among the candidates
    throughput: float  # 1.0 = the highest aggregate tok/s at the policy's concurrency


@dataclass(frozen=True)
class Candidate:
    mode: str
    tp: int
    pp: int
    dp: int
    gpus: tuple[int, ...]  # ordered as vLLM ranks them: replica, then stage, then TP rank
    transport: str
    predicted: Prediction | None = None
    rejected: str | None = None
    scores: Scores | None = None
    max_model_len: int | None = None
    need_gib: float = 0.0  # per GPU, with the context asked for (or the minimum)
    budget_gib: float = 0.0  # per GPU, smallest card × gpu_memory_utilization


@dataclass(frozen=True)
class Plan:
    mode: str  # 'single' | 'tp' | 'pp' | 'tp+pp' | 'dp'
    tp: int
    pp: int
    dp: int
    gpus: tuple[int, ...]
    engine: str  # 'gpu' | 'cpu'
    transport: str  # 'nvlink' | 'p2p-pcie' | 'shm' | 'net' | 'none'
    predicted: Prediction
    reasons: tuple[str, ...]
    candidates: tuple[Candidate, ...]
    max_model_len: int
    model: str
    family: str
    workload: str
    gpu_memory_utilization: float = 0.9
    nodes: int = 1
    env: Mapping[str, str] = field(default_factory=dict)
    flags: tuple[str, ...] = ()  # vLLM flags the layout needs (--disable-custom-all-reduce, ...)


def mode_name(tp: int, pp: int, dp: int) -> str:
    if dp > 1:
        return "dp"
    return {(1, 1): "single"}.get((tp, pp)) or ("tp" if pp == 1 else "pp" if tp == 1 else "tp+pp")


def _gib(n: float) -> float:
    return round(n / GIB, 1)


# ------------------------------------------------------------------------------------ memory


@dataclass(frozen=True)
class Fit:
    budget: float  # bytes per GPU
    need_fixed: float  # weights + overhead on the fullest GPU
    kv_budget: float  # KV bytes of one replica, all its GPUs together
    context: int  # the longest sequence the KV cache holds


def weights_per_gpu(m: ModelSpec, tp: int, pp: int) -> float:
    # PP splits the layers evenly and gives the embedding to the first stage, the LM head to
    # the last (a copy of the embedding when they are tied); TP splits the tables by vocabulary.
    tables = costmodel.table_bytes(m)
    per_stage = costmodel.embedding_bytes(m) if pp > 1 else tables
    return (m.weight_bytes - tables) * costmodel.stage_share(m, pp) / tp + per_stage / tp


def overhead_per_gpu(m: ModelSpec, tp: int, pp: int) -> float:
    act = BATCHED_TOKENS * (4 * m.hidden_size + 2 * m.intermediate_size / tp) * 2
    par = PARALLEL_OVERHEAD_BYTES if tp * pp > 1 else 0.0
    return BASE_OVERHEAD_BYTES + par + act


def kv_shards(m: ModelSpec, tp: int, pp: int) -> float:
    """Into how many parts the KV cache divides: KV heads over TP (replicated past the head
    count), layers over PP (the fullest stage sets the size)."""
    return min(tp, m.num_kv_heads) / costmodel.stage_share(m, pp)


def fit(m: ModelSpec, gpus: Sequence[Gpu], tp: int, pp: int, util: float) -> Fit:
    budget = min(g.memory_bytes for g in gpus) * util  # vLLM sizes every worker like the smallest
    fixed = weights_per_gpu(m, tp, pp) + overhead_per_gpu(m, tp, pp)
    shards = kv_shards(m, tp, pp)
    kv_budget = max(0.0, budget - fixed) * shards
    return Fit(budget, fixed, kv_budget, m.tokens_fitting(kv_budget))


# ---------------------------------------------------------------------------------- grouping


class _Links:
    """Pairwise links computed once per plan() call."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self._cache: dict[tuple[int, int], Link] = {}

    def between(self, a: Gpu, b: Gpu) -> Link:
        key = (min(a.index, b.index), max(a.index, b.index))
        if key not in self._cache:
            self._cache[key] = costmodel.link_between(self.topo, a, b)
        return self._cache[key]

    def group(self, gpus: Sequence[Gpu]) -> Link:
        return costmodel.worst_link(
            [self.between(a, b) for i, a in enumerate(gpus) for b in gpus[i + 1 :]]
        )


def _group_key(links: _Links, gpus: Sequence[Gpu]) -> tuple[float, float, int]:
    link = links.group(gpus)
    speed = min(hardware.gpu_model(g.name, g.cc).mem_bw_gbs for g in gpus)
    return (link.gbs, speed, -sum(g.index for g in gpus))


def _best_group(links: _Links, pool: Sequence[Gpu], size: int) -> tuple[Gpu, ...]:
    if size == 1:
        return (
            max(
                pool,
                key=lambda g: (
                    hardware.gpu_model(g.name, g.cc).mem_bw_gbs,
                    g.memory_bytes,
                    -g.index,
                ),
            ),
        )
    return max(itertools.combinations(pool, size), key=lambda c: _group_key(links, c))


def _split(links: _Links, pool: Sequence[Gpu], parts: int, size: int) -> list[tuple[Gpu, ...]]:
    """Greedy: the best-joined group of ``size`` first, then the best of what is left."""
    rest, out = list(pool), []
    for _ in range(parts):
        grp = _best_group(links, rest, size)
        out.append(tuple(sorted(grp, key=lambda g: g.index)))
        rest = [g for g in rest if g not in grp]
    return out


# ------------------------------------------------------------------------------- candidates


@dataclass(frozen=True)
class _Shape:
    tp: int
    pp: int
    dp: int


def _shapes(n: int, policy: Policy) -> list[_Shape]:
    out = []
    for tp, pp, dp in itertools.product(range(1, n + 1), repeat=3):
        if tp * pp * dp > n:
            continue
        if any(
            f is not None and f != v
            for f, v in ((policy.force_tp, tp), (policy.force_pp, pp), (policy.force_dp, dp))
        ):
            continue
        out.append(_Shape(tp, pp, dp))
    return out


def _structural_reject(m: ModelSpec, s: _Shape) -> str | None:
    if m.num_heads % s.tp:
        return f"TP={s.tp}: {m.num_heads} attention heads are not divisible by {s.tp}"
    if m.num_kv_heads % s.tp and s.tp % m.num_kv_heads:
        return (
            f"TP={s.tp}: {m.num_kv_heads} KV heads can be neither split nor replicated over {s.tp}"
        )
    if s.pp > m.num_layers:
        return f"PP={s.pp}: more stages than the {m.num_layers} layers"
    return None


def _layout(
    links: _Links,
    groups: list[tuple[Gpu, ...]],
    s: _Shape,
    m: ModelSpec,
    f: Fit,
    internode: Link | None,
) -> Layout:
    replica = groups[0]
    stages = tuple(replica[i * s.tp : (i + 1) * s.tp] for i in range(s.pp))
    tp_link = (
        costmodel.worst_link([links.group(st) for st in stages]) if s.tp > 1 else costmodel.NO_LINK
    )
    hops = [links.between(stages[i][0], stages[i + 1][0]) for i in range(s.pp - 1)]
    if internode is not None:
        hops.append(internode)
    pp_link = costmodel.worst_link(hops) if s.pp > 1 else costmodel.NO_LINK
    return Layout(
        tp=s.tp,
        pp=s.pp,
        dp=s.dp,
        stages=stages,
        tp_link=tp_link,
        pp_link=pp_link,
        kv_budget_bytes=f.kv_budget,
    )


def _order_replica(links: _Links, replica: Sequence[Gpu], tp: int, pp: int) -> tuple[Gpu, ...]:
    """vLLM's rank = stage × tp + tp_rank: put the best-joined GPUs in the same TP group."""
    if pp == 1 or tp == 1:
        return tuple(sorted(replica, key=lambda g: g.index))
    return tuple(g for grp in _split(links, replica, pp, tp) for g in grp)


def _candidate(
    m: ModelSpec, policy: Policy, links: _Links, pool: Sequence[Gpu], s: _Shape
) -> tuple[Candidate, Layout | None]:
    k = s.tp * s.pp * s.dp
    mode = mode_name(s.tp, s.pp, s.dp)
    blank = Candidate(mode, s.tp, s.pp, s.dp, (), "none")
    why = _structural_reject(m, s)
    if why:
        return replace(blank, rejected=why), None
    best: tuple[tuple[float, float], Candidate, Layout] | None = None
    first_reject: Candidate | None = None
    for subset in _subsets(pool, k):
        groups = [
            _order_replica(links, g, s.tp, s.pp) for g in _split(links, subset, s.dp, s.tp * s.pp)
        ]
        cand, lay = _evaluate(m, policy, links, groups, s, None)
        if lay is None:
            first_reject = first_reject or cand
            continue
        assert cand.predicted is not None
        key = _rank_key(cand.predicted, policy.workload)
        if best is None or key > best[0]:
            best = (key, cand, lay)
    if best is None:
        return (first_reject or replace(blank, rejected="no GPU set of this size")), None
    return best[1], best[2]


def _subsets(pool: Sequence[Gpu], k: int) -> list[tuple[Gpu, ...]]:
    if len(pool) > 8:  # beyond one box, keep the first k in bus order
        return [tuple(pool[:k])]
    return list(itertools.combinations(pool, k))


def _evaluate(
    m: ModelSpec,
    policy: Policy,
    links: _Links,
    groups: list[tuple[Gpu, ...]],
    s: _Shape,
    internode: Link | None,
) -> tuple[Candidate, Layout | None]:
    replica = groups[0]
    f = fit(m, [g for grp in groups for g in grp], s.tp, s.pp, policy.gpu_memory_utilization)
    lay = _layout(links, groups, s, m, f, internode)
    transport = (
        lay.tp_link.transport if s.tp > 1 else (lay.pp_link.transport if s.pp > 1 else "none")
    )
    wanted = policy.max_model_len or min(MIN_CONTEXT, m.max_position_embeddings)
    need = f.need_fixed + m.kv_bytes(wanted) / kv_shards(m, s.tp, s.pp)
    gpus = tuple(g.index for grp in groups for g in grp)
    cand = Candidate(
        mode_name(s.tp, s.pp, s.dp),
        s.tp,
        s.pp,
        s.dp,
        gpus,
        transport,
        need_gib=_gib(need),
        budget_gib=_gib(f.budget),
    )
    if need > f.budget:
        smallest = min(replica, key=lambda g: g.memory_bytes)
        return replace(
            cand,
            rejected=(
                f"needs {_gib(need)} GiB per GPU ({_gib(weights_per_gpu(m, s.tp, s.pp))} weights + "
                f"{_gib(need - f.need_fixed)} KV for {wanted} tokens + "
                f"{_gib(overhead_per_gpu(m, s.tp, s.pp))} "
                f"overhead), has {_gib(f.budget)} GiB ({policy.gpu_memory_utilization} × "
                f"{_gib(smallest.memory_bytes)} GiB of {smallest.name})"
            ),
        ), None
    context = min(f.context, m.max_position_embeddings)
    pred = costmodel.predict(
        m,
        lay,
        prompt=policy.prompt_tokens,
        gen=policy.gen_tokens,
        concurrency=policy.streams,
        max_num_seqs=policy.max_num_seqs,
    )
    return replace(cand, predicted=pred, max_model_len=policy.max_model_len or context), lay


def _rank_key(p: Prediction, workload: str) -> tuple[float, float]:
    inter, tput = -p.e2e_s, p.throughput_tok_s
    return (inter, tput) if workload == "interactive" else (tput, inter)


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


# ------------------------------------------------------------------------------ the settings


def _tp_pairs(topo: Topology, cand: Candidate) -> list[tuple[int, int]]:
    """GPU pairs that share an all-reduce (same replica, same stage)."""
    g, out = cand.gpus, []
    for start in range(0, len(g), cand.tp):
        grp = g[start : start + cand.tp]
        out += [(a, b) for i, a in enumerate(grp) for b in grp[i + 1 :]]
    return out


def settings(topo: Topology, cand: Candidate) -> tuple[dict[str, str], tuple[str, ...], list[str]]:
    """Environment and vLLM flags the chosen layout needs on these links, each with its reason."""
    env: dict[str, str] = {}
    flags: list[str] = []
    why: list[str] = []
    pairs = [topo.pair(a, b) for a, b in _tp_pairs(topo, cand)]
    if cand.tp > 1 and cand.transport == "shm":
        flags.append("--disable-custom-all-reduce")
        why.append(
            "--disable-custom-all-reduce: no P2P between the TP GPUs, and vLLM's custom "
            "all-reduce needs CUDA IPC between them; NCCL goes through host memory (SHM)"
        )
    elif cand.tp > 2 and not all(p.nvlinks > 0 for p in pairs):
        flags.append("--disable-custom-all-reduce")
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
    return env, tuple(flags), why


# ------------------------------------------------------------------------------------ reasons


def _describe_topology(topo: Topology, links: _Links) -> list[str]:
    names: dict[str, int] = {}
    for g in topo.gpus:
        names[g.name] = names.get(g.name, 0) + 1
    out = [
        ", ".join(f"{n}× {name}" for name, n in names.items())
        + " ("
        + ", ".join(f"GPU{g.index} {_gib(g.memory_bytes)} GiB" for g in topo.gpus)
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
    if len(names) > 1:
        out.append(
            "mixed GPU models: every worker is sized to the smallest card's memory and runs "
            "at the slowest card's speed"
        )
    return out


def _describe_model(m: ModelSpec) -> str:
    q = f"{m.quantization} {m.weight_bits:g}-bit" if m.quantization else m.dtype
    window = (
        f", {m.sliding_layers} sliding-window layers ({m.sliding_window} tokens)"
        if m.sliding_layers
        else ""
    )
    return (
        f"{m.name}: {m.params / 1e9:.1f}B parameters, {_gib(m.weight_bytes)} GiB of weights ({q}), "
        f"KV {m.kv_bytes_per_layer_token() * m.num_layers // 1024} KiB/token{window}"
    )


def _describe_choice(
    c: Candidate, cands: Sequence[Candidate], workload: str, streams: int
) -> list[str]:
    assert c.predicted is not None
    p = c.predicted
    label = _label(c)
    out = [
        f"{label} chosen for {workload} (concurrency {streams}): "
        f"prefill {p.prefill_tok_s:.0f} tok/s, decode {p.decode_tok_s:.1f} tok/s, "
        f"{p.e2e_s:.1f} s for 512→256, {p.throughput_tok_s:.0f} tok/s "
        f"over {streams} stream(s)"
    ]
    for o in cands:
        if o is c or o.predicted is None or o.scores is None:
            continue
        out.append(
            f"  vs {_label(o)}: interactive {o.scores.interactive:.2f}, throughput "
            f"{o.scores.throughput:.2f} (prefill {o.predicted.prefill_tok_s:.0f}, decode "
            f"{o.predicted.decode_tok_s:.1f}, {o.predicted.throughput_tok_s:.0f} tok/s)"
        )
    return out


def _shape_label(c: Candidate) -> str:
    return f"{c.mode} TP={c.tp} PP={c.pp} DP={c.dp}"


def _label(c: Candidate) -> str:
    parts = [f"TP={c.tp}"] if c.tp > 1 else []
    parts += [f"PP={c.pp}"] if c.pp > 1 else []
    parts += [f"DP={c.dp}"] if c.dp > 1 else []
    gpus = ",".join(str(g) for g in c.gpus)
    return (
        f"{' '.join(parts) or 'one GPU'} [GPU {gpus}] over {c.transport}"
        if c.tp * c.pp > 1
        else f"{' '.join(parts) or 'one GPU'} [GPU {gpus}]"
    )


# ----------------------------------------------------------------------------------- no fit


def _variant(m: ModelSpec, bits: float) -> ModelSpec:
    embed = costmodel.embedding_bytes(m)
    linear_params = m.params - embed // 2
    return replace(
        m,
        weight_bytes=int(linear_params * bits / 8 * 1.03 + embed),
        quantization=f"{bits:g}-bit",
        weight_bits=bits,
    )


def _no_fit(topo: Topology, m: ModelSpec, policy: Policy, cands: Sequence[Candidate]) -> PlanError:
    sized = [c for c in cands if c.budget_gib > 0]
    if not sized:
        why = "; ".join(sorted({c.rejected or "" for c in cands}))
        return PlanError(f"{m.name}: no layout of it is valid on {len(topo.gpus)} GPU(s): {why}")
    biggest = min(sized, key=lambda c: c.need_gib - c.budget_gib)
    wanted = policy.max_model_len or min(MIN_CONTEXT, m.max_position_embeddings)
    n = len(biggest.gpus)
    msg = (
        f"{m.name} does not fit: {_label(biggest)} needs {biggest.need_gib} GiB per GPU "
        f"({_gib(m.weight_bytes)} GiB of weights in all, KV for {wanted} tokens), "
        f"has {biggest.budget_gib} GiB per GPU "
        f"({n} × {biggest.budget_gib} = {n * biggest.budget_gib:.1f} GiB)"
    )
    fixes = []
    for bits, label in ((8.0, "an FP8 variant"), (4.0, "a 4-bit AWQ/GPTQ variant")):
        if m.weight_bits > bits:
            v = _variant(m, bits)
            try:
                vp = plan(topo, v, replace(policy, force_tp=None, force_pp=None, force_dp=None))
            except PlanError:
                continue
            fixes.append(
                f"{label} (~{_gib(v.weight_bytes)} GiB of weights) as TP={vp.tp} PP={vp.pp}"
            )
            break
    budget = max(c.budget_gib for c in sized) * GIB
    kv_wanted = m.kv_bytes(wanted)
    for k in (2, 4, 8, 16, 32, 64):
        need = (
            weights_per_gpu(m, k, 1)
            + overhead_per_gpu(m, k, 1)
            + kv_wanted / min(k, m.num_kv_heads)
        )
        if k > len(topo.gpus) and m.num_heads % k == 0 and need <= budget:
            fixes.append(f"{k} GPUs like these as TP={k} ({_gib(need)} GiB per GPU)")
            break
    rooms = [
        (c.budget_gib * GIB - weights_per_gpu(m, c.tp, c.pp) - overhead_per_gpu(m, c.tp, c.pp), c)
        for c in sized
    ]
    room, c = max(rooms, key=lambda rc: rc[0])
    shorter = m.tokens_fitting(room * kv_shards(m, c.tp, c.pp)) if room > 0 else 0
    if shorter >= 256:
        fixes.append(f"a shorter context, --max-model-len {shorter} ({_label(c)})")
    return PlanError(msg + ". Would fit: " + "; or ".join(fixes))


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


def _cpu_plan(m: ModelSpec, policy: Policy, topo: Topology) -> Plan:
    pred = costmodel.predict_cpu(
        m,
        policy.cpu_cores,
        prompt=policy.prompt_tokens,
        gen=policy.gen_tokens,
        concurrency=policy.streams,
    )
    context = policy.max_model_len or min(m.max_position_embeddings, m.tokens_fitting(4 * GIB))
    cand = Candidate(
        "single",
        1,
        1,
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
        _describe_model(m),
        f"predicted on {policy.cpu_cores} CPU cores at an assumed {costmodel.CPU_MEM_GBS:g} GB/s "
        f"of DRAM bandwidth: prefill {pred.prefill_tok_s:.0f} tok/s, "
        f"decode {pred.decode_tok_s:.1f} tok/s",
    )
    return Plan(
        mode="single",
        tp=1,
        pp=1,
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
    )


def plan(topology: Topology, model: ModelSpec, policy: Policy | None = None) -> Plan:
    """The best layout of ``model`` on ``topology`` for ``policy``, with every candidate and reason.

    Raises PlanError (with GiB needed against GiB available and what would fit) when none fits.
    """
    policy = policy or Policy()
    _check_policy(model, policy)
    if not topology.gpus:
        if policy.nodes > 1:
            raise PlanError(
                "multi-node planning needs one node's GPUs: pass --topology FILE saved "
                "with `launcher probe --save FILE` on a node"
            )
        return _cpu_plan(model, policy, topology)
    links = _Links(topology)
    if policy.nodes > 1:
        cands = _multinode_candidates(topology, model, policy, links)
    else:
        cands = [
            _candidate(model, policy, links, topology.gpus, s)[0]
            for s in _shapes(len(topology.gpus), policy)
        ]
    cands = _with_scores(cands)
    if not any(c.predicted for c in cands):
        raise _no_fit(topology, model, policy, cands)
    chosen = _choose(cands, policy.workload)
    env, flags, why = settings(topology, chosen)
    if policy.nodes > 1:
        flags = (*flags, "--distributed-executor-backend", "ray")
        why.append(
            f"{policy.nodes} nodes: TP={chosen.tp} inside each node, PP={chosen.pp} stages, "
            f"{policy.nodes - 1} of the hops over the network (~{policy.internode_gbs:.0f} GB/s "
            "assumed); vLLM runs on a Ray cluster (--distributed-executor-backend ray)"
        )
        why += _per_node_note(topology, model, policy)
    rejected = [
        f"rejected {_label(c) if c.gpus else _shape_label(c)}: {c.rejected}"
        for c in cands
        if c.rejected
    ]
    assert chosen.predicted is not None
    assert chosen.max_model_len is not None
    reasons = (
        *_describe_topology(topology, links),
        *topology.notes,
        _describe_model(model),
        *_describe_choice(chosen, cands, policy.workload, policy.streams),
        *why,
        *rejected,
        f"max_model_len {chosen.max_model_len}: "
        + ("asked for" if policy.max_model_len else "the longest context the KV cache holds"),
    )
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
        gpu_memory_utilization=policy.gpu_memory_utilization,
        nodes=policy.nodes,
        env=env,
        flags=flags,
    )


# ------------------------------------------------------------------------------- multi-node


def _multinode_candidates(
    topo: Topology, m: ModelSpec, policy: Policy, links: _Links
) -> list[Candidate]:
    """N identical nodes of G GPUs, one model over all of them: TP inside a node (TP never
    crosses the network), PP across nodes (and inside a node too when TP < G).

    ``topo`` is one node; every node is assumed to look like it.
    """
    per = policy.gpus_per_node or len(topo.gpus)
    if per > len(topo.gpus):
        raise PlanError(
            f"--gpus-per-node {per}, but the node topology has {len(topo.gpus)} GPUs; "
            "pass the topology of one node with --topology"
        )
    node = _best_group(links, topo.gpus, per) if per < len(topo.gpus) else tuple(topo.gpus)
    net = Link("net", policy.internode_gbs, hardware.ALLREDUCE_LATENCY_S["net"])
    out = []
    for tp in (t for t in range(1, per + 1) if per % t == 0):
        s = _Shape(tp, per // tp * policy.nodes, 1)
        forced = ((policy.force_tp, s.tp), (policy.force_pp, s.pp), (policy.force_dp, 1))
        if any(f is not None and f != v for f, v in forced):
            continue
        out.append(_node_candidate(m, policy, links, node, s, net))
    return out


def _node_candidate(
    m: ModelSpec, policy: Policy, links: _Links, node: Sequence[Gpu], s: _Shape, net: Link
) -> Candidate:
    why = _structural_reject(m, s)
    if why:
        gpus = tuple(g.index for g in node)
        return Candidate(mode_name(s.tp, s.pp, 1), s.tp, s.pp, 1, gpus, "none", rejected=why)
    ordered = _order_replica(links, node, s.tp, len(node) // s.tp)
    cand, _ = _evaluate(m, policy, links, [tuple(ordered) * policy.nodes], s, net)
    # the GPUs are those of each node; the pipeline's extra stages are on the other nodes
    cand = replace(cand, gpus=tuple(g.index for g in ordered))
    return replace(cand, transport="net") if s.tp == 1 else cand


def _per_node_note(topo: Topology, m: ModelSpec, policy: Policy) -> list[str]:
    """When one node holds the model, replicas per node beat any split over the network."""
    try:
        one = plan(
            topo,
            m,
            replace(
                policy, nodes=1, gpus_per_node=None, force_tp=None, force_pp=None, force_dp=None
            ),
        )
    except PlanError:
        return [f"one node cannot hold {m.name}: the split over {policy.nodes} nodes is needed"]
    return [
        f"one node holds {m.name} ({mode_name(one.tp, one.pp, one.dp)} TP={one.tp} PP={one.pp}, "
        f"{one.predicted.throughput_tok_s:.0f} tok/s there): {policy.nodes} independent replicas, "
        "one `launcher serve` per node behind a load balancer, avoid the network entirely and "
        f"would give ~{policy.nodes * one.predicted.throughput_tok_s:.0f} tok/s together"
    ]
