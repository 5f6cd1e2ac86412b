"""Plan ↔ JSON: what ``launcher plan --json`` prints (:func:`plan_to_json`, the agent plan's part
:func:`agent_to_json`), and the readers ``launcher serve --plan FILE`` uses
(:func:`plan_from_json`, :func:`saved_extra_args`, :func:`saved_agent_flags`), which take any
file and give a plan or a one-line PlanError naming the field that is wrong. Pure."""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from launcher.engine.render import Rendered
from launcher.engine.vllmflags import OptionalFlag
from launcher.errors import PlanError
from launcher.planner.agent import AgentPlan
from launcher.planner.costmodel import Prediction
from launcher.planner.loadsim import SimulatedPrediction
from launcher.planner.plan import Candidate, Plan, Scores
from launcher.planner.plantypes import (
    BACKENDS,
    ENGINES,
    MODES,
    WORKLOADS,
    EngineSettings,
    Rejection,
)
from launcher.probe.topology import TRANSPORTS

C = TypeVar("C", bound=str)


def _pred(p: Prediction | None) -> dict[str, Any] | None:
    return (
        None
        if p is None
        else {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(p).items()}
    )


def _paced(pred: dict[str, Any] | None, plan: Plan) -> dict[str, Any] | None:
    """The plan's figures with, where its host timing's pace is unsteady, each moving figure's
    span at the timing's rounds' speed: ``host_pace_range: {figure: [low, high]}`` (the plan's
    word, as ``ttft_p50_range_s``: not read back)."""
    if pred is None or not plan.host_pace_range:
        return pred
    return {**pred, "host_pace_range": {k: [low, high]
                                        for k, (low, high) in plan.host_pace_range.items()}}


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
        "predicted": _paced(_pred(plan.predicted), plan),
        "reasons": list(plan.reasons),
        # the first engine's command, and every engine (one per replica) as serve runs them
        "argv": list(rendered.argv),
        "env": dict(rendered.env),
        "engines": [{"argv": list(e.argv()), "env": dict(e.env)} for e in rendered.engines],
        "plan_env": dict(plan.env),
        "flags": list(settings_words(plan.settings)),
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


def _choice(d: Mapping[str, Any], key: str, choices: tuple[C, ...], default: C | None = None) -> C:
    """One of ``choices`` (a Literal's values): past here a plan holds no other."""
    value = _text(d, key, default)
    for choice in choices:
        if value == choice:
            return choice
    raise _BadPlan(f"{key} must be one of {', '.join(choices)}, not {value!r}")


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
    pred = Prediction(prefill_tok_s=_number(d, "prefill_tok_s"),
                      decode_tok_s=_number(d, "decode_tok_s"),
                      throughput_tok_s=_number(d, "throughput_tok_s"),
                      ttft_s=_number(d, "ttft_s"), e2e_s=_number(d, "e2e_s"),
                      batch=_count(d, "batch", low=0))
    load = [k for k in SimulatedPrediction.__dataclass_fields__
            if k not in Prediction.__dataclass_fields__]
    if not any(k in d for k in load):
        return pred  # no simulated load (a plan of an earlier release, a pipeline's)
    missing = [k for k in load if k not in d]
    if missing:
        raise _BadPlan(f"predicted lacks {', '.join(missing)}")
    return SimulatedPrediction(
        **asdict(pred), ttft_p50_s=_number(d, "ttft_p50_s"), ttft_p90_s=_number(d, "ttft_p90_s"),
        tpot_p50_s=_number(d, "tpot_p50_s"),
        load_concurrency=_count(d, "load_concurrency"), load_requests=_count(d, "load_requests"),
        sim_throughput_tok_s=_number(d, "sim_throughput_tok_s"))


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
        mode=_choice(d, "mode", MODES),
        tp=_count(d, "tp"),
        pp=_count(d, "pp"),
        dp=_count(d, "dp"),
        gpus=_gpus(d),
        transport=_choice(d, "transport", TRANSPORTS, "none"),
        predicted=_pred_from(d.get("predicted")),
        # a plan file keeps the reason's prose only
        rejection=None if rejected is None else Rejection("recorded", text=_text(d, "rejected")),
        scores=Scores(**{k: _number(s, k) for k in Scores.__dataclass_fields__}) if s else None,
        max_model_len=limit if limit is None else _count(d, "max_model_len"),
        need_gib=_number(d, "need_gib"),
        budget_gib=_number(d, "budget_gib"),
    )


def settings_words(s: EngineSettings) -> tuple[str, ...]:
    """A plan's engine settings as a plan file keeps them: vLLM's words for each."""
    words: tuple[str, ...] = ("--disable-custom-all-reduce",) if s.disable_custom_all_reduce else ()
    if s.distributed_backend is not None:
        words += ("--distributed-executor-backend", s.distributed_backend)
    return words


def _settings_from(words: tuple[str, ...]) -> EngineSettings:
    """What :func:`settings_words` wrote; any other word is not a plan's (flags of the user's
    own go in vllm_extra_args)."""
    left = list(words)
    no_custom = "--disable-custom-all-reduce" in left
    left = [w for w in left if w != "--disable-custom-all-reduce"]
    backend: str | None = None
    if left[:1] == ["--distributed-executor-backend"] and len(left) >= 2:
        backend, left = left[1], left[2:]
    if left:
        raise _BadPlan(f"flags holds {' '.join(left)!r}, which no plan sets: vLLM flags of your "
                       "own go in vllm_extra_args")
    chosen = None
    if backend is not None:
        chosen = next((b for b in BACKENDS if b == backend), None)
        if chosen is None:
            raise _BadPlan(f"--distributed-executor-backend must be one of "
                           f"{', '.join(BACKENDS)}, not {backend!r}")
    return EngineSettings(disable_custom_all_reduce=no_custom, distributed_backend=chosen)


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
        engine = _choice(d, "engine", ENGINES, "gpu")
        tp, pp, dp = _count(d, "tp"), _count(d, "pp"), _count(d, "dp")
        gpus, nodes = _gpus(d), _count(d, "nodes", default=1)
        if engine == "gpu" and nodes == 1 and len(gpus) != tp * pp * dp:
            raise _BadPlan(f"tp {tp} x pp {pp} x dp {dp} needs {tp * pp * dp} GPUs, and gpus "
                           f"lists {len(gpus)}")
        utilization = _number(d, "gpu_memory_utilization", 0.9)
        if not 0 < utilization <= 1:
            raise _BadPlan(f"gpu_memory_utilization must be in (0, 1], not {utilization}")
        return Plan(
            mode=_choice(d, "mode", MODES),
            tp=tp,
            pp=pp,
            dp=dp,
            gpus=gpus,
            engine=engine,
            transport=_choice(d, "transport", TRANSPORTS, "none"),
            predicted=pred,
            reasons=_texts(d, "reasons"),
            candidates=tuple(_cand_from(c) for c in candidates),
            max_model_len=_count(d, "max_model_len"),
            model=_text(d, "model", ""),
            family=_text(d, "family", ""),
            workload=_choice(d, "workload", WORKLOADS, "interactive"),
            gpu_memory_utilization=utilization,
            nodes=nodes,
            env=dict(env),
            settings=_settings_from(_texts(d, "flags")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise PlanError(
            f"not a plan written by `launcher plan --json` ({exc}); "
            "write one with `launcher plan --model M --json > plan.json`"
        ) from exc


def agent_to_json(ap: AgentPlan) -> dict[str, Any]:
    """The agent plan for `plan --json`: the choice, every option and every layout's room, and
    its vLLM flags with what each is for (`serve --plan FILE` gives them again)."""
    return {
        "sessions": ap.ask.sessions, "context": ap.ask.context, "served_context": ap.context,
        "choice": ap.choice, "layout": ap.room.layout, "kv_cache_dtype": ap.room.kv_dtype,
        "kv_offloading_gib": ap.offload_gib,
        "options": [{"name": o.name, "ok": o.ok, "reason": o.reason, "ttft_s": o.ttft_s}
                    for o in ap.options],
        "rooms": [{"layout": r.layout, "kv_cache_dtype": r.kv_dtype, "sessions_held": r.held,
                   "sessions_per_replica": r.need, "ttft_cached_s": r.ttft_warm_s,
                   "ttft_recomputed_s": r.ttft_cold_s, "host_copy_s": r.copy_s}
                  for r in ap.rooms],
        "flags": [list(f.words) for f in ap.flags],
        "flag_reasons": [f.why for f in ap.flags],
    }


EMBEDDED_MODEL = "embedded"  # model_ref of a plan made for the embedded tiny model (no --model)


@dataclass(frozen=True)
class SavedModel:
    """The model a plan file was made for, recorded beside the plan by `plan --json` and `tune`,
    so that `serve --plan FILE` serves that model (and refuses another)."""

    # what vLLM was given: an absolute folder, a hub id, or EMBEDDED_MODEL; None: not recorded
    # (a file written before the record was, or by hand)
    ref: str | None
    name: str  # the plan's own `model`: the folder's name or the hub id ("" where none)
    revision: str | None = None  # the hub revision it was planned at
    served_name: str | None = None
    config_sha256: str | None = None  # of the config.json the plan was sized from


def model_to_json(m: SavedModel) -> dict[str, Any]:
    """The record's fields of a plan file (the name is the plan's own ``model``)."""
    return {"model_ref": m.ref, "revision": m.revision, "served_name": m.served_name,
            "config_sha256": m.config_sha256}


def _shown(value: object) -> str:
    """A value of the file in an error line: quoted, escaped, and short."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _plain(value: object, key: str) -> str:
    """A string a command line can carry and an error line can show: no control characters,
    line breaks or lone surrogates (none of which a folder name vLLM can load or a hub id has)."""
    if not isinstance(value, str) or not value or any(
            unicodedata.category(c) in ("Cc", "Cs", "Zl", "Zp") for c in value):
        raise _BadPlan(f"{key} must be a non-empty string of printable text, not {_shown(value)}")
    return value


def _model_ref(value: object) -> str:
    ref = _plain(value, "model_ref")
    org, _, name = ref.partition("/")
    hub_id = ref.count("/") == 1 and org and name and not ref.startswith((".", "~"))
    if ref != EMBEDDED_MODEL and not ref.startswith("/") and not hub_id:
        raise _BadPlan(f"model_ref must be an absolute model folder, a hub id (org/name) or "
                       f"{EMBEDDED_MODEL!r}, not {_shown(ref)}")
    return ref


def saved_model(d: Mapping[str, Any]) -> SavedModel:
    """The model record of a plan file (:func:`model_to_json`); a PlanError in one line, naming
    the field, for a record that is not one."""
    try:
        name = _text(d, "model", "")
        if "model_ref" not in d:
            return SavedModel(None, name)
        revision, served, digest = (d.get(k) for k in ("revision", "served_name",
                                                         "config_sha256"))
        if digest is not None and not (isinstance(digest, str) and len(digest) == 64 and all(
                c in "0123456789abcdef" for c in digest)):
            raise _BadPlan(f"config_sha256 must be 64 hex digits, not {_shown(digest)}")
        return SavedModel(_model_ref(d["model_ref"]), name,
                          None if revision is None else _plain(revision, "revision"),
                          None if served is None else _plain(served, "served_name"), digest)
    except _BadPlan as exc:
        raise PlanError(f"not a plan written by `launcher plan --json` ({exc}); write one with "
                        "`launcher plan --model M --json > plan.json`") from None


SAVED_AGENT_FLAG = "the agent plan saved in the plan file asks for it"


def saved_agent_flags(d: Mapping[str, Any]) -> tuple[OptionalFlag, ...]:
    """The vLLM flags of the agent plan a plan file was made for (none without one), so that
    `serve --plan FILE` starts the engine `plan --json` printed; a PlanError in one line for a
    malformed list."""
    agent = d.get("agent")
    if agent is None:
        return ()
    flags = agent.get("flags", []) if isinstance(agent, Mapping) else None
    if not isinstance(flags, list) or not all(
            isinstance(f, list) and f and all(isinstance(w, str) for w in f) for f in flags):
        raise PlanError("not a plan written by `launcher plan --json` (agent.flags must be a "
                        "list of flags, each a list of words)")
    why = agent.get("flag_reasons")
    whys = (why if isinstance(why, list) and len(why) == len(flags)
            and all(isinstance(w, str) for w in why) else [SAVED_AGENT_FLAG] * len(flags))
    return tuple(OptionalFlag(tuple(f), w) for f, w in zip(flags, whys, strict=True))


def saved_extra_args(d: Mapping[str, Any]) -> tuple[str, ...]:
    """The vLLM flags a tuned plan won with (`launcher tune` writes them as vllm_extra_args)."""
    extra = d.get("vllm_extra_args", [])
    if not isinstance(extra, list) or not all(isinstance(w, str) for w in extra):
        raise PlanError("not a plan written by `launcher tune` (vllm_extra_args must be a list "
                        "of words)")
    return tuple(extra)
