"""Plan → the `vllm serve` command line and environment; Plan ↔ JSON. Pure.

The JSON (:func:`plan_to_json`) is what ``launcher plan --json`` prints, and
``plan_from_json`` reads it back for ``launcher serve --plan FILE``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from launcher.costmodel import Prediction
from launcher.enginecmd import EngineCommand, replicas
from launcher.errors import PlanError
from launcher.plan import Candidate, Plan, Scores
from launcher.plantypes import CPU_KV_CACHE_GIB
from launcher.toolcalls import choose_tool_parser


@dataclass(frozen=True)
class EngineOptions:
    """What the user says about the engine beyond the plan (the same options in plan and serve)."""

    served_name: str | None = None
    revision: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    trust_remote_code: bool = False
    ray_address: str | None = None
    extra_args: tuple[str, ...] = ()
    cpu_ids: tuple[int, ...] = ()  # the CPUs this process may use (CPU engine only)
    # What the model's tokenizer holds (None: unread): a tool parser needs its marker tokens.
    tokenizer_tokens: frozenset[str] | None = None


@dataclass(frozen=True)
class Rendered:
    """The engines that run a plan: one per data-parallel replica, each on its own GPUs and
    port (the proxy spreads requests over them), and the notes the user should read."""

    engines: tuple[EngineCommand, ...]
    notes: tuple[str, ...] = ()

    @property
    def argv(self) -> tuple[str, ...]:
        return self.engines[0].argv()

    @property
    def env(self) -> dict[str, str]:
        return dict(self.engines[0].env)


def engine_command(plan: Plan, model_ref: str, opts: EngineOptions,
                   user_env: Mapping[str, str] | None = None) -> EngineCommand:
    """The one engine command that runs ``plan`` (before the split into replicas)."""
    env: dict[str, str] = {}
    flags = list(plan.flags)
    backend = _take_value(flags, "--distributed-executor-backend")
    no_custom_ar = _take_switch(flags, "--disable-custom-all-reduce")
    if plan.engine == "gpu":
        # NVML numbers GPUs by PCI bus; CUDA does so only when told, so the indices agree.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in plan.gpus)
        env.update(plan.env)
    else:
        env.update(_cpu_env(plan, opts.cpu_ids, user_env or {}))
    if opts.ray_address:
        env["RAY_ADDRESS"] = opts.ray_address
        backend = backend or "ray"
    return EngineCommand(
        model=model_ref, host=opts.host, port=opts.port, served_name=opts.served_name,
        revision=opts.revision, tp=plan.tp, pp=plan.pp, max_model_len=plan.max_model_len,
        gpu_memory_utilization=plan.gpu_memory_utilization if plan.engine == "gpu" else None,
        # A coding agent resends its growing conversation: prefix caching reuses the shared
        # prefix, chunked prefill keeps long prompts from stalling other streams' tokens.
        prefix_caching=True, chunked_prefill=True,
        tool_parser=choose_tool_parser(plan.family, opts.tokenizer_tokens)[0],
        trust_remote_code=opts.trust_remote_code,
        distributed_backend=backend, disable_custom_all_reduce=no_custom_ar,
        layout_flags=tuple(flags), env=env, extra_args=opts.extra_args,
    )


def render(
    plan: Plan,
    model_ref: str,
    *,
    served_name: str | None,
    host: str,
    port: int,
    extra_args: Sequence[str] = (),
    trust_remote_code: bool = False,
    ray_address: str | None = None,
    user_env: Mapping[str, str] | None = None,
    cpu_ids: Sequence[int] = (),
    revision: str | None = None,
    tokenizer_tokens: frozenset[str] | None = None,
    custom_code: bool = False,
) -> Rendered:
    """The engines that run ``plan``: replica ``i`` listens on ``port + i``."""
    opts = EngineOptions(served_name=served_name, host=host, port=port,
                         trust_remote_code=trust_remote_code, ray_address=ray_address,
                         extra_args=tuple(extra_args), cpu_ids=tuple(cpu_ids),
                         revision=revision, tokenizer_tokens=tokenizer_tokens)
    cmd = engine_command(plan, model_ref, opts, user_env)
    notes: list[str] = []
    if custom_code and not trust_remote_code:
        notes.append("config.json names its own modelling code (auto_map) for a model type this "
                     "transformers does not know: vLLM will refuse it without "
                     "--trust-remote-code; pass --trust-remote-code if you trust the repository")
    parser_note = choose_tool_parser(plan.family, tokenizer_tokens)[1]
    if parser_note and cmd.tool_parser is None:
        notes.append(parser_note)
    if plan.dp > 1:
        notes.append(f"dp={plan.dp}: {plan.dp} vLLM servers on ports {port}..{port + plan.dp - 1}, "
                     "each on its own GPUs; `launcher serve` puts the proxy in front of them")
    return Rendered(replicas(cmd, plan.dp, bind=host, first_port=port), tuple(notes))


def _cpu_env(plan: Plan, cpu_ids: Sequence[int], user_env: Mapping[str, str]) -> dict[str, str]:
    env = {}
    if "VLLM_CPU_KVCACHE_SPACE" not in user_env:
        # vLLM's CPU backend reserves --gpu-memory-utilization of *host* memory unless a KV-cache
        # size is given; on a shared machine that start-up check fails, so we size it.
        env["VLLM_CPU_KVCACHE_SPACE"] = f"{CPU_KV_CACHE_GIB:g}"
    ranks = plan.tp * plan.pp
    if ranks > 1 and "VLLM_CPU_OMP_THREADS_BIND" not in user_env:
        # vLLM binds each CPU worker to a NUMA node of its own and refuses to start with more
        # workers than nodes ("Not enough allowed NUMA nodes"); give each rank its own cores.
        per = len(cpu_ids) // ranks
        env["VLLM_CPU_OMP_THREADS_BIND"] = (
            "|".join(",".join(map(str, cpu_ids[r * per:(r + 1) * per])) for r in range(ranks))
            if per else "nobind")
    return env


def _take_switch(flags: list[str], name: str) -> bool:
    found = name in flags
    while name in flags:
        flags.remove(name)
    return found


def _take_value(flags: list[str], name: str) -> str | None:
    if name in flags[:-1]:
        i = flags.index(name)
        value = flags[i + 1]
        del flags[i:i + 2]
        return value
    return None


# ------------------------------------------------------------------------------------- JSON


def _pred(p: Prediction | None) -> dict[str, Any] | None:
    return (
        None
        if p is None
        else {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(p).items()}
    )


def candidate_to_json(c: Candidate) -> dict[str, Any]:
    return {
        "mode": c.mode,
        "tp": c.tp,
        "pp": c.pp,
        "dp": c.dp,
        "gpus": list(c.gpus),
        "transport": c.transport,
        "predicted": _pred(c.predicted),
        "rejected": c.rejected,
        "scores": None if c.scores is None else asdict(c.scores),
        "max_model_len": c.max_model_len,
        "need_gib": c.need_gib,
        "budget_gib": c.budget_gib,
    }


def plan_to_json(plan: Plan, rendered: Rendered) -> dict[str, Any]:
    return {
        "mode": plan.mode,
        "tp": plan.tp,
        "pp": plan.pp,
        "dp": plan.dp,
        "gpus": list(plan.gpus),
        "engine": plan.engine,
        "transport": plan.transport,
        "nodes": plan.nodes,
        "model": plan.model,
        "family": plan.family,
        "workload": plan.workload,
        "max_model_len": plan.max_model_len,
        "gpu_memory_utilization": plan.gpu_memory_utilization,
        "predicted": _pred(plan.predicted),
        "reasons": list(plan.reasons),
        # the first engine's command, and every engine (one per replica) as serve runs them
        "argv": list(rendered.argv),
        "env": dict(rendered.env),
        "engines": [{"argv": list(e.argv()), "env": dict(e.env)} for e in rendered.engines],
        "plan_env": dict(plan.env),
        "flags": list(plan.flags),
        "notes": list(rendered.notes),
        "candidates": [candidate_to_json(c) for c in plan.candidates],
    }


class _BadPlan(ValueError):
    """A field of a plan file that is missing or not what `launcher plan --json` writes."""


def _count(d: Mapping[str, Any], key: str, low: int = 1, default: int | None = None) -> int:
    value = d.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise _BadPlan(f"{key} must be a whole number of at least {low}, not {value!r}")
    return value


def _text(d: Mapping[str, Any], key: str, default: str | None = None) -> str:
    value = d.get(key, default)
    if not isinstance(value, str):
        raise _BadPlan(f"{key} must be a string, not {value!r}")
    return value


def _texts(d: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = d.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _BadPlan(f"{key} must be a list of strings")
    return tuple(value)


def _number(d: Mapping[str, Any], key: str, default: float = 0.0) -> float:
    value = d.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _BadPlan(f"{key} must be a finite number, not {value!r}")
    return float(value)


def _pred_from(d: object) -> Prediction | None:
    if d is None:
        return None
    if not isinstance(d, Mapping):
        raise _BadPlan("predicted must be an object")
    missing = [k for k in Prediction.__dataclass_fields__ if k not in d]
    if missing:
        raise _BadPlan(f"predicted lacks {', '.join(missing)}")
    return Prediction(prefill_tok_s=_number(d, "prefill_tok_s"),
                      decode_tok_s=_number(d, "decode_tok_s"),
                      throughput_tok_s=_number(d, "throughput_tok_s"),
                      ttft_s=_number(d, "ttft_s"), e2e_s=_number(d, "e2e_s"),
                      batch=_count(d, "batch", low=0))


def _gpus(d: Mapping[str, Any]) -> tuple[int, ...]:
    value = d.get("gpus", [])
    if not isinstance(value, list) or not all(
            isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in value):
        raise _BadPlan("gpus must be a list of GPU indices")
    return tuple(value)


def _cand_from(d: object) -> Candidate:
    if not isinstance(d, Mapping):
        raise _BadPlan("each candidate must be an object")
    s = d.get("scores")
    if s is not None and not isinstance(s, Mapping):
        raise _BadPlan("a candidate's scores must be an object")
    rejected = d.get("rejected")
    limit = d.get("max_model_len")
    return Candidate(
        mode=_text(d, "mode"),
        tp=_count(d, "tp"),
        pp=_count(d, "pp"),
        dp=_count(d, "dp"),
        gpus=_gpus(d),
        transport=_text(d, "transport", "none"),
        predicted=_pred_from(d.get("predicted")),
        rejected=rejected if rejected is None else _text(d, "rejected"),
        scores=Scores(**{k: _number(s, k) for k in Scores.__dataclass_fields__}) if s else None,
        max_model_len=limit if limit is None else _count(d, "max_model_len"),
        need_gib=_number(d, "need_gib"),
        budget_gib=_number(d, "budget_gib"),
    )


def plan_from_json(d: object) -> Plan:
    """Read back what :func:`plan_to_json` wrote (``launcher serve --plan FILE``); a PlanError
    in one line, naming the field, for anything else."""
    try:
        if not isinstance(d, Mapping):
            raise _BadPlan("the file holds no JSON object")
        pred = _pred_from(d.get("predicted"))
        if pred is None:
            raise _BadPlan("predicted is missing")
        env = d.get("plan_env", {})
        if not isinstance(env, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise _BadPlan("plan_env must map names to strings")
        candidates = d.get("candidates", [])
        if not isinstance(candidates, list):
            raise _BadPlan("candidates must be a list")
        engine = _text(d, "engine", "gpu")
        tp, pp, dp = _count(d, "tp"), _count(d, "pp"), _count(d, "dp")
        gpus, nodes = _gpus(d), _count(d, "nodes", default=1)
        if engine == "gpu" and nodes == 1 and len(gpus) != tp * pp * dp:
            raise _BadPlan(f"tp {tp} x pp {pp} x dp {dp} needs {tp * pp * dp} GPUs, and gpus "
                           f"lists {len(gpus)}")
        utilization = _number(d, "gpu_memory_utilization", 0.9)
        if not 0 < utilization <= 1:
            raise _BadPlan(f"gpu_memory_utilization must be in (0, 1], not {utilization}")
        return Plan(
            mode=_text(d, "mode"),
            tp=tp,
            pp=pp,
            dp=dp,
            gpus=gpus,
            engine=engine,
            transport=_text(d, "transport", "none"),
            predicted=pred,
            reasons=_texts(d, "reasons"),
            candidates=tuple(_cand_from(c) for c in candidates),
            max_model_len=_count(d, "max_model_len"),
            model=_text(d, "model", ""),
            family=_text(d, "family", ""),
            workload=_text(d, "workload", "interactive"),
            gpu_memory_utilization=utilization,
            nodes=nodes,
            env=dict(env),
            flags=_texts(d, "flags"),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise PlanError(
            f"not a plan written by `launcher plan --json` ({exc}); "
            "write one with `launcher plan --model M --json > plan.json`"
        ) from exc
