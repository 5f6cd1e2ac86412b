"""Plan → the `vllm serve` command line and environment; Plan ↔ JSON. Pure.

The JSON (:func:`plan_to_json`) is what ``launcher plan --json`` prints, and
``plan_from_json`` reads it back for ``launcher serve --plan FILE``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from launcher.costmodel import Prediction
from launcher.errors import PlanError
from launcher.plan import Candidate, Plan, Scores

# vLLM's --tool-call-parser per model family (vllm/entrypoints/openai/tool_parsers/).
TOOL_PARSERS = {
    "llama": "llama3_json",
    "mistral": "mistral",
    "qwen2": "hermes",
    "qwen3": "hermes",
    "deepseek": "deepseek_v3",
    "phi": "phi4_mini_json",
}


@dataclass(frozen=True)
class Rendered:
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


def render(
    plan: Plan,
    model_ref: str,
    *,
    served_name: str | None,
    host: str,
    port: int,
    extra_args: Sequence[str] = (),
) -> Rendered:
    """The command that runs ``plan``; ``extra_args`` go last so the user's flags win."""
    argv: list[str] = ["vllm", "serve", model_ref, "--host", host, "--port", str(port)]
    if served_name:
        argv += ["--served-model-name", served_name]
    env: dict[str, str] = {}
    notes: list[str] = []
    if plan.engine == "gpu":
        argv += ["--tensor-parallel-size", str(plan.tp), "--pipeline-parallel-size", str(plan.pp)]
        if plan.dp > 1:
            argv += ["--data-parallel-size", str(plan.dp)]
        argv += ["--gpu-memory-utilization", f"{plan.gpu_memory_utilization:g}"]
        # NVML numbers GPUs by PCI bus; CUDA does so only when told, so the indices agree.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in plan.gpus)
        env.update(plan.env)
        argv += list(plan.flags)
    argv += ["--max-model-len", str(plan.max_model_len)]
    # A coding agent resends its growing conversation: prefix caching reuses the shared prefix,
    # chunked prefill keeps long prompts from stalling other streams' tokens.
    argv += ["--enable-prefix-caching", "--enable-chunked-prefill"]
    parser = TOOL_PARSERS.get(plan.family)
    if parser:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", parser]
    else:
        notes.append(f"no vLLM tool-call parser known for the {plan.family} family: tool calls off")
    argv += list(extra_args)
    return Rendered(argv=tuple(argv), env=env, notes=tuple(notes))


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
        "argv": list(rendered.argv),
        "env": dict(rendered.env),
        "plan_env": dict(plan.env),
        "flags": list(plan.flags),
        "notes": list(rendered.notes),
        "candidates": [candidate_to_json(c) for c in plan.candidates],
    }


def _pred_from(d: Mapping[str, Any] | None) -> Prediction | None:
    if d is None:
        return None
    return Prediction(**{k: d[k] for k in Prediction.__dataclass_fields__})


def _cand_from(d: Mapping[str, Any]) -> Candidate:
    s = d.get("scores")
    return Candidate(
        mode=d["mode"],
        tp=d["tp"],
        pp=d["pp"],
        dp=d["dp"],
        gpus=tuple(d.get("gpus", ())),
        transport=d.get("transport", "none"),
        predicted=_pred_from(d.get("predicted")),
        rejected=d.get("rejected"),
        scores=Scores(**s) if s else None,
        max_model_len=d.get("max_model_len"),
        need_gib=d.get("need_gib", 0.0),
        budget_gib=d.get("budget_gib", 0.0),
    )


def plan_from_json(d: Mapping[str, Any]) -> Plan:
    """Read back what :func:`plan_to_json` wrote (``launcher serve --plan FILE``)."""
    try:
        pred = _pred_from(d["predicted"])
        assert pred is not None
        return Plan(
            mode=d["mode"],
            tp=int(d["tp"]),
            pp=int(d["pp"]),
            dp=int(d["dp"]),
            gpus=tuple(d["gpus"]),
            engine=d.get("engine", "gpu"),
            transport=d.get("transport", "none"),
            predicted=pred,
            reasons=tuple(d.get("reasons", ())),
            candidates=tuple(_cand_from(c) for c in d.get("candidates", ())),
            max_model_len=int(d["max_model_len"]),
            model=d.get("model", ""),
            family=d.get("family", ""),
            workload=d.get("workload", "interactive"),
            gpu_memory_utilization=float(d.get("gpu_memory_utilization", 0.9)),
            nodes=int(d.get("nodes", 1)),
            env=dict(d.get("plan_env", {})),
            flags=tuple(d.get("flags", ())),
        )
    except (KeyError, TypeError, ValueError, AssertionError) as exc:
        raise PlanError(
            f"not a plan written by `launcher plan --json` ({type(exc).__name__}: {exc}); "
            "write one with `launcher plan --model M --json > plan.json`"
        ) from exc
