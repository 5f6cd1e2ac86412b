"""Several identical nodes: TP inside a node, pipeline stages across them. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from launcher.errors import PlanError
from launcher.model.modelspec import ModelSpec
from launcher.planner import hardware
from launcher.planner.costmodel import Link
from launcher.planner.layouts import (
    Links,
    Shape,
    best_group,
    evaluate,
    order_replica,
    structural_reject,
)
from launcher.planner.plantypes import Candidate, Policy, mode_name
from launcher.probe.topology import Gpu, Topology


def multinode_candidates(
    topo: Topology, m: ModelSpec, policy: Policy, links: Links
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
    node = best_group(links, topo.gpus, per) if per < len(topo.gpus) else tuple(topo.gpus)
    net = Link("net", policy.internode_gbs, hardware.ALLREDUCE_LATENCY_S["net"])
    out = []
    for tp in (t for t in range(1, per + 1) if per % t == 0):
        s = Shape(tp, per // tp * policy.nodes, 1)
        forced = ((policy.force_tp, s.tp), (policy.force_pp, s.pp), (policy.force_dp, 1))
        if any(f is not None and f != v for f, v in forced):
            continue
        out.append(_node_candidate(m, policy, links, node, s, net))
    return out


def _node_candidate(
    m: ModelSpec, policy: Policy, links: Links, node: Sequence[Gpu], s: Shape, net: Link
) -> Candidate:
    why = structural_reject(m, s)
    if why:
        gpus = tuple(g.index for g in node)
        return Candidate(mode_name(s.tp, s.pp, 1), s.tp, s.pp, 1, gpus, "none", rejection=why)
    ordered = order_replica(links, node, s.tp, len(node) // s.tp)
    cand, _ = evaluate(m, policy, links, [tuple(ordered) * policy.nodes], s, net)
    # the GPUs are those of each node; the pipeline's extra stages are on the other nodes
    cand = replace(cand, gpus=tuple(g.index for g in ordered))
    return replace(cand, transport="net") if s.tp == 1 else cand


def per_node_note(m: ModelSpec, policy: Policy, one: Candidate | None) -> list[str]:
    """When one node holds the model (``one``: the best layout on a single node, None where
    none fits), replicas per node beat any split over the network."""
    if one is None or one.predicted is None:
        return [f"one node cannot hold {m.name}: the split over {policy.nodes} nodes is needed"]
    tput = one.predicted.throughput_tok_s
    return [
        f"one node holds {m.name} ({one.mode} TP={one.tp} PP={one.pp}, "
        f"{tput:.0f} tok/s there): {policy.nodes} independent replicas, "
        "one `launcher serve` per node behind a load balancer, avoid the network entirely and "
        f"would give ~{policy.nodes * tput:.0f} tok/s together"
    ]
