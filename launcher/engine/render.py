"""Plan → the `vllm serve` command line and environment. Pure. (Plan ↔ JSON: planfile.py.)"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from launcher.engine.enginecmd import EngineCommand, NodePlace, replicas
from launcher.engine.extras import EngineExtras
from launcher.engine.vllmflags import keep_known
from launcher.model.toolcalls import choose_tool_parser
from launcher.planner.plan import Plan
from launcher.planner.plantypes import CPU_KV_ENV, cpu_kv_cache_gib


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
    chat_template: str | None = None  # its tool-call markers pick the parser
    place: NodePlace | None = None  # this node's rank in a group (vLLM's multi-node executor)


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
    backend: str | None = plan.settings.distributed_backend
    if plan.engine == "gpu":
        # NVML numbers GPUs by PCI bus; CUDA does so only when told, so the indices agree.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in plan.gpus)
        env.update(plan.env)
    else:
        env.update(_cpu_env(plan, opts.cpu_ids, user_env or {}, opts.place))
    if opts.place is not None:
        # vLLM's own executor across the nodes: the planner's Ray default does not apply.
        backend = None if backend == "ray" else backend
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
        tool_parser=choose_tool_parser(plan.family, opts.tokenizer_tokens, opts.chat_template)[0],
        trust_remote_code=opts.trust_remote_code,
        distributed_backend=backend,
        disable_custom_all_reduce=plan.settings.disable_custom_all_reduce, place=opts.place,
        env=env, extra_args=opts.extra_args,
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
    chat_template: str | None = None,
    place: NodePlace | None = None,
    extras: EngineExtras | None = None,
    no_chat_template: bool = False,
) -> Rendered:
    """The engines that run ``plan``: replica ``i`` listens on ``port + i``. ``extras``: flags
    beyond the layout (serve's), each kept only where the installed vLLM takes it."""
    opts = EngineOptions(served_name=served_name, host=host, port=port,
                         trust_remote_code=trust_remote_code, ray_address=ray_address,
                         extra_args=tuple(extra_args), cpu_ids=tuple(cpu_ids),
                         revision=revision, tokenizer_tokens=tokenizer_tokens,
                         chat_template=chat_template, place=place)
    cmd = engine_command(plan, model_ref, opts, user_env)
    notes: list[str] = []
    if extras is not None:
        words, left_out = keep_known(extras.flags, extras.known)
        # Before the user's own flags (extra_args), which still win.
        cmd = replace(cmd, layout_flags=(*cmd.layout_flags, *words)).with_env(**extras.env)
        notes += left_out
    if custom_code and not trust_remote_code:
        notes.append("config.json names its own modelling code (auto_map) for a model type this "
                     "transformers does not know: vLLM will refuse it without "
                     "--trust-remote-code; pass --trust-remote-code if you trust the repository")
    if no_chat_template and not any(a == "--chat-template" or a.startswith("--chat-template=")
                                    for a in extra_args):
        # vLLM starts without one and refuses each chat request (HTTP 400), which is what every
        # coding agent sends: said before the start, not found by the first client
        notes.append("the model's files have no chat template: vLLM will serve completions "
                     "only and refuse every chat request (HTTP 400), which is what coding agents "
                     "send; for chat pass `-- --chat-template FILE` (an instruct model's "
                     "template), or serve the instruct variant")
    parser_note = choose_tool_parser(plan.family, tokenizer_tokens, chat_template)[1]
    if parser_note and cmd.tool_parser is None:
        notes.append(parser_note)
    if plan.dp > 1:
        notes.append(f"dp={plan.dp}: {plan.dp} vLLM servers on ports {port}..{port + plan.dp - 1}, "
                     "each on its own GPUs; `launcher serve` puts the proxy in front of them")
    return Rendered(replicas(cmd, plan.dp, bind=host, first_port=port), tuple(notes))


def _cpu_env(plan: Plan, cpu_ids: Sequence[int], user_env: Mapping[str, str],
             place: NodePlace | None = None) -> dict[str, str]:
    env = {}
    if place is not None and place.headless and "VLLM_TARGET_DEVICE" not in user_env:
        # A headless node's process finds no platform by itself on the CPU build.
        env["VLLM_TARGET_DEVICE"] = "cpu"
    if CPU_KV_ENV not in user_env:
        # vLLM's CPU backend reserves --gpu-memory-utilization of *host* memory unless a KV-cache
        # size is given; on a shared machine that start-up check fails, so we size it: the cache
        # the plan sized its context for (plan.cpu_kv_space)
        env[CPU_KV_ENV] = f"{cpu_kv_cache_gib(plan):g}"
    if "VLLM_USE_AOT_COMPILE" not in user_env:
        # vLLM 0.32's CPU engine (torch >= 2.10 turns AOT compile on) cannot load the AOT
        # artifact it saved ("'function' object has no attribute 'finalize_loading'") and
        # compiles again at every start; off, it loads torch.compile's own cache. The embedded
        # model on 2 cores: 70.6 s to /health with it, 55.6 and 56.1 s without (cached).
        env["VLLM_USE_AOT_COMPILE"] = "0"
    # the workers of this node only: with several nodes, the stages are spread over them
    ranks = plan.tp * plan.pp // (place.nodes if place is not None else 1)
    if (ranks > 1 or place is not None) and "VLLM_CPU_OMP_THREADS_BIND" not in user_env:
        # vLLM binds each CPU worker to a NUMA node of its own and refuses to start with more
        # workers than nodes ("Not enough allowed NUMA nodes"); give each rank its own cores.
        # A node of several gets the cores it was started on (`taskset`), even for one worker:
        # two "nodes" sharing a machine must not bind the same cores.
        per = len(cpu_ids) // ranks
        env["VLLM_CPU_OMP_THREADS_BIND"] = (
            "|".join(",".join(map(str, cpu_ids[r * per:(r + 1) * per])) for r in range(ranks))
            if per else "nobind")
    return env

