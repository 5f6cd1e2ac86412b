"""What a command asks of the pipeline, typed: built from argparse by the CLI (the only place
that sees it), handed to :func:`launcher.pipeline.run.plan_and_render`. Frozen, no logic."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from launcher.engine.enginecmd import NodePlace
from launcher.planner.agent import AgentAsk
from launcher.planner.plantypes import Policy


@dataclass(frozen=True)
class EngineRequest:
    """How the chosen plan's engine is started, beyond the plan: the same for plan (which
    prints the command), serve (which runs it) and tune (which measures it)."""

    served_name: str | None = None  # None: the model's own name
    host: str = "127.0.0.1"
    port: int | None = None  # vLLM's (first) port; None: a free one on ``host``
    # the user's own vLLM flags (after --), passed on last so that they win
    extra_args: tuple[str, ...] = ()
    trust_remote_code: bool = False
    ray_address: str | None = None
    place: NodePlace | None = None  # this node's place in a group (vLLM's own executor)
    cpu_ids: tuple[int, ...] = ()  # the CPUs a CPU engine's workers are spread over
    # the engine's side of the media check (engine/extras.py): hosts media may come from
    media_domains: tuple[str, ...] = ()
    allow_internal_media: bool = False


@dataclass(frozen=True)
class PlanRequest:
    """One plan asked for, and the engine command it is rendered into."""

    model: str | None  # a local folder or hub id as given; None: the embedded tiny model
    policy: Policy
    engine: EngineRequest
    revision: str | None = None
    topology: str | None = None  # a saved topology file; None: this machine's, through NVML
    # the serving host's front-end timing saved by `probe --measure` there (None: this machine's
    # kept one for its own NVML reading, else the shipped profile)
    host_timing: str | None = None
    agent: AgentAsk | None = None  # --workload agent: the sessions and their context
    # the host's free memory for the agent plan's KV offloading, as TOPOSERVE_HOST_FREE_GIB
    # says (None: the topology's own, read with it or saved in its file)
    host_free_bytes: int | None = None
    # `serve --plan FILE`: the saved plan instead of planning (its flags and agent plan kept)
    saved_plan: Path | None = None
    # a saved plan naming GPUs this machine lacks: refused (serve), or a note (--dry-run)
    refuse_elsewhere: bool = True


@dataclass(frozen=True)
class ServeRequest:
    """`launcher serve` (and each start of `launcher tune`): a plan, and the proxy before it."""

    plan: PlanRequest
    host: str = "127.0.0.1"  # the proxy's address
    port: int = 8000
    api_keys: tuple[str, ...] = ()
    proxy_args: tuple[str, ...] = ()  # the proxy's local-serving options, as its own words
