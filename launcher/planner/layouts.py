"""Candidate search: every (TP, PP, DP) shape, the GPUs grouped for it, each one evaluated. Pure.

Memory comes from :mod:`launcher.planner.memfit`, speed from :mod:`launcher.planner.costmodel`;
this module only
enumerates, groups and ranks.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

from launcher.model.modelspec import GIB, ModelSpec
from launcher.planner import costmodel, cudagraphs, hardware, memfit
from launcher.planner.costmodel import Layout, Link, Prediction
from launcher.planner.plantypes import (
    MIN_CONTEXT,
    Candidate,
    Policy,
    Rejection,
    gib,
    mode_name,
)
from launcher.planner.searchmemo import SearchMemo
from launcher.probe.topology import Gpu, Topology

# ---------------------------------------------------------------------------------- grouping


class Links:
    """Pairwise links computed once per plan() call, with the search's other answers: a
    group's joining (keyed by the GPUs' numbers, which name one GPU of ``topo`` here as in
    :meth:`between`), and the fits and predictions (:attr:`memo`)."""

    def __init__(self, topo: Topology, graphs: cudagraphs.Requested = cudagraphs.VLLM_RULE,
                 host: hardware.HostProfile | None = None) -> None:
        self.topo = topo
        # what decides the served engine's CUDA graphs (the policy's: Policy.cuda_graphs);
        # each layout resolves them on its own GPUs (replica_layout)
        self.graphs = graphs
        self._cache: dict[tuple[int, int], Link] = {}
        self._joined: dict[tuple[int, ...], Link] = {}
        self._groups: dict[tuple[int, ...], tuple[float, float, int]] = {}
        # the serving host's profile: timed here by `probe --measure`, or the shipped one
        # (``host``: another, as the host-pace span plans the chosen layout at the rounds' speed)
        self.host = host or hardware.host_profile(topo.host_timing)
        self.memo = SearchMemo()
        self._machine: _Machine | None = None

    @property
    def machine(self) -> _Machine:
        """This topology as :func:`_groupings` keys it (made once per plan)."""
        if self._machine is None:
            self._machine = _Machine(self)
        return self._machine

    def between(self, a: Gpu, b: Gpu) -> Link:
        key = (min(a.index, b.index), max(a.index, b.index))
        if key not in self._cache:
            self._cache[key] = costmodel.link_between(self.topo, a, b)
        return self._cache[key]

    def group(self, gpus: Sequence[Gpu]) -> Link:
        key = tuple(g.index for g in gpus)
        found = self._joined.get(key)
        if found is None:
            found = self._joined[key] = costmodel.worst_link(
                [self.between(a, b) for i, a in enumerate(gpus) for b in gpus[i + 1 :]]
            )
        return found


def _group_key(links: Links, gpus: Sequence[Gpu]) -> tuple[float, float, int]:
    key = tuple(g.index for g in gpus)
    found = links._groups.get(key)
    if found is None:
        link = links.group(gpus)
        speed = min(hardware.gpu_model(g.name, g.cc).mem_bw_gbs for g in gpus)
        found = links._groups[key] = (link.gbs, speed, -sum(g.index for g in gpus))
    return found


def best_group(links: Links, pool: Sequence[Gpu], size: int) -> tuple[Gpu, ...]:
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


def _split(links: Links, pool: Sequence[Gpu], parts: int, size: int) -> list[tuple[Gpu, ...]]:
    """Greedy: the best-joined group of ``size`` first, then the best of what is left."""
    rest, out = list(pool), []
    for _ in range(parts):
        grp = best_group(links, rest, size)
        out.append(tuple(sorted(grp, key=lambda g: g.index)))
        rest = [g for g in rest if g not in grp]
    return out


# ------------------------------------------------------------------------------- candidates


@dataclass(frozen=True)
class Shape:
    tp: int
    pp: int
    dp: int


def shapes(n: int, policy: Policy) -> list[Shape]:
    out = []
    for tp, pp, dp in itertools.product(range(1, n + 1), repeat=3):
        if tp * pp * dp > n:
            continue
        if any(
            f is not None and f != v
            for f, v in ((policy.force_tp, tp), (policy.force_pp, pp), (policy.force_dp, dp))
        ):
            continue
        out.append(Shape(tp, pp, dp))
    return out


def structural_reject(m: ModelSpec, s: Shape) -> Rejection | None:
    if m.num_heads % s.tp:
        return Rejection("heads", tp=s.tp, count=m.num_heads)
    if m.num_kv_heads % s.tp and s.tp % m.num_kv_heads:
        return Rejection("kv_heads", tp=s.tp, count=m.num_kv_heads)
    if s.pp > m.num_layers:
        return Rejection("layers", pp=s.pp, count=m.num_layers)
    return None


def replica_layout(
    links: Links,
    replica: Sequence[Gpu],
    s: Shape,
    kv_budget: float,
    internode: Link | None = None,
) -> Layout:
    """The cost model's view of one replica: ``replica``'s GPUs in vLLM's rank order (stage,
    then TP rank), each stage's TP group joined by its worst link, the stages by the worst hop
    between them (``internode`` among them where they span nodes), ``kv_budget`` bytes of KV
    cache, the host's front end (``links.host``) and the served engine's CUDA graphs on these
    GPUs (``links.graphs``)."""
    stages = tuple(tuple(replica[i * s.tp : (i + 1) * s.tp]) for i in range(s.pp))
    tp_link, pp_link = _stage_links(links, stages, s, internode)
    return Layout(
        tp=s.tp,
        pp=s.pp,
        dp=s.dp,
        stages=stages,
        tp_link=tp_link,
        pp_link=pp_link,
        kv_budget_bytes=kv_budget,
        host=links.host,
        graphs=links.graphs.on(g.cc for g in replica),
    )


def _stage_links(links: Links, stages: Sequence[Sequence[Gpu]], s: Shape,
                 internode: Link | None) -> tuple[Link, Link]:
    """A replica's TP link (its stages' worst group) and PP link (the worst hop)."""
    tp_link = (
        costmodel.worst_link([links.group(st) for st in stages]) if s.tp > 1 else costmodel.NO_LINK
    )
    hops = [links.between(stages[i][0], stages[i + 1][0]) for i in range(s.pp - 1)]
    if internode is not None:
        hops.append(internode)
    pp_link = costmodel.worst_link(hops) if s.pp > 1 else costmodel.NO_LINK
    return tp_link, pp_link


def _physics(links: Links, groups: Sequence[tuple[Gpu, ...]], s: Shape) -> tuple[object, ...]:
    """Everything :func:`evaluate` reads of ``groups`` besides the GPUs' names (numbers, UUIDs,
    bus addresses: only echoed into the candidate): what each GPU is, in rank order, and how the
    first replica's stages are joined. Two groupings alike in it get the same fit, prediction
    and rank key (:mod:`launcher.planner.searchmemo`)."""
    first = groups[0]
    stages = [first[i * s.tp : (i + 1) * s.tp] for i in range(s.pp)]
    return (tuple(tuple(links.memo.kind(g) for g in grp) for grp in groups),
            _stage_links(links, stages, s, None))


def candidate_layout(c: Candidate, topo: Topology, links: Links, kv_budget: float) -> Layout:
    """The cost model's view of a sized candidate's first replica on one node (its GPUs listed
    replica, stage, TP rank first, as vLLM ranks them): what the load simulation and the agent
    plan time."""
    by_index = {g.index: g for g in topo.gpus}
    return replica_layout(links, [by_index[i] for i in c.gpus[:c.tp * c.pp]],
                          Shape(c.tp, c.pp, c.dp), kv_budget)


def order_replica(links: Links, replica: Sequence[Gpu], tp: int, pp: int) -> tuple[Gpu, ...]:
    """vLLM's rank = stage × tp + tp_rank: put the best-joined GPUs in the same TP group."""
    if pp == 1 or tp == 1:
        return tuple(sorted(replica, key=lambda g: g.index))
    return tuple(g for grp in _split(links, replica, pp, tp) for g in grp)


def best_candidate(
    m: ModelSpec, policy: Policy, links: Links, pool: Sequence[Gpu], s: Shape
) -> tuple[Candidate, Layout | None]:
    mode = mode_name(s.tp, s.pp, s.dp)
    blank = Candidate(mode, s.tp, s.pp, s.dp, (), "none")
    why = structural_reject(m, s)
    if why:
        return replace(blank, rejection=why), None
    best: tuple[tuple[tuple[float, float], float], Candidate, Layout] | None = None
    first_reject: Candidate | None = None
    for tried in _groupings(links.machine, tuple(pool), s):
        groups = [tuple(pool[i] for i in grp) for grp in tried]
        cand, lay = evaluate(m, policy, links, groups, s, None)
        if lay is None:
            first_reject = first_reject or cand
            continue
        assert cand.predicted is not None
        # equal speed: the GPUs with more room for KV (a desktop holding memory on one of them)
        key = (rank_key(cand.predicted, policy.workload), lay.kv_budget_bytes)
        if best is None or key > best[0]:
            best = (key, cand, lay)
    if best is None:
        return (first_reject or replace(blank, rejection=Rejection("no_gpu_set"))), None
    return best[1], best[2]


class _Machine:
    """What grouping a topology's GPUs reads of it (every GPU, every pair's link), to key the
    groupings of :func:`_groupings` by: equal for every plan of one machine in this process
    (the agent plan plans twice, a test hundreds of times), whatever the model or workload.
    It refers to its plan's :class:`Links` (which a grouping is worked out with, on a miss:
    the plan is then running) weakly, so that the cache keeps no plan's memo alive."""

    def __init__(self, links: Links) -> None:
        self.links = weakref.ref(links)
        gpus = tuple(links.topo.gpus)
        self.key = (gpus, tuple(links.between(a, b)
                                for i, a in enumerate(gpus) for b in gpus[i + 1:]))
        self._hash = hash(self.key)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Machine) and self.key == other.key


@lru_cache(maxsize=1024)
def _groupings(machine: _Machine, pool: tuple[Gpu, ...],
               s: Shape) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """The GPU groupings (by place in ``pool``) :func:`best_candidate` evaluates for shape ``s`` on
    ``pool``: each subset of the pool greedily split into replicas and stages, bar one alike in
    everything but the GPUs' names to a grouping before it (most of an 8-GPU box's subsets),
    which would get that one's rank key, so could not beat it (a later grouping wins only when
    strictly better) nor come first among the rejected. In subset order, as the search had
    them; kept per machine, being the same for every model and workload."""
    links = machine.links()
    assert links is not None  # a miss is worked out for the plan asking, with its Links
    place = {id(g): i for i, g in enumerate(pool)}
    out, seen = [], set()
    for subset in _subsets(pool, s.tp * s.pp * s.dp):
        groups = [
            order_replica(links, g, s.tp, s.pp) for g in _split(links, subset, s.dp, s.tp * s.pp)
        ]
        physics = _physics(links, groups, s)
        if physics not in seen:
            seen.add(physics)
            out.append(tuple(tuple(place[id(g)] for g in grp) for grp in groups))
    return tuple(out)


def _subsets(pool: Sequence[Gpu], k: int) -> list[tuple[Gpu, ...]]:
    if len(pool) > 8:  # beyond one box, keep the first k in bus order
        return [tuple(pool[:k])]
    return list(itertools.combinations(pool, k))


def evaluate(
    m: ModelSpec,
    policy: Policy,
    links: Links,
    groups: list[tuple[Gpu, ...]],
    s: Shape,
    internode: Link | None,
) -> tuple[Candidate, Layout | None]:
    used = [g for grp in groups for g in grp]
    util = memfit.startable_utilization(used, policy.gpu_memory_utilization)
    memo = links.memo  # the same figures for the same cards under other numbers
    # vLLM's CUDA-graph estimate comes out of the KV budget on its V1 runner: the graphs the
    # served engine captures on these GPUs (the user's flags' range, else vLLM's default)
    f = memo.fit(m, used, s.tp, s.pp, util, policy.kv_cache_bytes,
                 policy.cpu_offload_gib * GIB, links.graphs.on(g.cc for g in used))
    lay = replica_layout(links, groups[0], s, f.kv_budget, internode)
    transport = (
        lay.tp_link.transport if s.tp > 1 else (lay.pp_link.transport if s.pp > 1 else "none")
    )
    wanted = policy.max_model_len or min(MIN_CONTEXT, m.max_position_embeddings)
    need = memo.need_per_gpu(f, m, s.tp, s.pp, wanted)
    gpus = tuple(g.index for grp in groups for g in grp)
    # what other processes hold, each GPU once in bus order (the nodes of a multi-node group
    # repeat one node's GPUs)
    held = memfit.held_by_others(sorted({g.index: g for g in used}.values(),
                                        key=lambda g: g.index), policy.gpu_memory_utilization)
    cand = Candidate(
        mode_name(s.tp, s.pp, s.dp),
        s.tp,
        s.pp,
        s.dp,
        gpus,
        transport,
        need_gib=gib(need),
        budget_gib=gib(f.budget),
        gpu_memory_utilization=util,
        fit=f,
        held=held,
    )
    if util <= 0:
        return replace(cand, rejection=Rejection("no_room", held=held)), None
    if need > f.budget:
        smallest = min(used, key=lambda g: g.memory_bytes)
        return replace(cand, rejection=Rejection(
            "memory", tp=s.tp, pp=s.pp, need_gib=gib(need), weights_gib=gib(f.weights),
            kv_gib=gib(need - f.need_fixed), overhead_gib=gib(f.overhead), tokens=wanted,
            have_gib=gib(f.budget), utilization=util,
            lowered=util < policy.gpu_memory_utilization, card_gib=gib(smallest.memory_bytes),
            card=smallest.name, held=held)), None
    measured = memo.layout_prediction(
        m, policy.kernels, lay, batched_tokens=f.limits.batched_tokens,
        max_num_seqs=policy.max_num_seqs, prompt=policy.prompt_tokens, gen=policy.gen_tokens,
        concurrency=policy.streams, kv_dtype_bytes=f.kv_dtype_bytes,
    )
    if measured is not None:
        return replace(cand, predicted=measured[0], kernel_table=measured[1],
                       max_model_len=policy.max_model_len or f.context), lay
    pred = memo.predict(
        m,
        lay,
        prompt=policy.prompt_tokens,
        gen=policy.gen_tokens,
        concurrency=policy.streams,
        kv_sequences=memo.sequences_held(m, f, policy.prompt_tokens + policy.gen_tokens),
        max_num_seqs=policy.max_num_seqs,
        batched_tokens=f.limits.batched_tokens,
    )
    return replace(cand, predicted=pred, max_model_len=policy.max_model_len or f.context), lay


def rank_key(p: Prediction, workload: str) -> tuple[float, float]:
    inter, tput = -p.e2e_s, p.throughput_tok_s
    return (inter, tput) if workload == "interactive" else (tput, inter)
