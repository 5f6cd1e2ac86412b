"""The planner's values: the policy asked for, candidates, the plan. Frozen; the only logic
is a rejection's reason rendered from its numbers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, get_args

from launcher.model.families import LOGGED_VLLM, ServedVllm
from launcher.model.modelspec import GIB
from launcher.planner import cudagraphs, hardware, memfit
from launcher.planner.costmodel import Prediction
from launcher.planner.memfit import Fit
from launcher.probe.kernels import KernelTable
from launcher.probe.topology import Transport

# What a plan's free-text fields may hold; plan files and options are checked against these at
# the edge (engine/planfile.py, cli/planopts.py), so code past it never meets another value.
Workload = Literal["interactive", "throughput"]
Mode = Literal["single", "tp", "pp", "tp+pp", "dp"]
EngineKind = Literal["gpu", "cpu"]
WORKLOADS: tuple[Workload, ...] = get_args(Workload)
MODES: tuple[Mode, ...] = get_args(Mode)
ENGINES: tuple[EngineKind, ...] = get_args(EngineKind)
MIN_CONTEXT = 4096  # below this a coding agent cannot work; shorter only when asked for


# What the CPU engine's KV cache is given unless the user sets VLLM_CPU_KVCACHE_SPACE or the
# model needs more for its context (plan.cpu_kv_space): vLLM's CPU backend otherwise reserves
# --gpu-memory-utilization of host memory, which fails on a shared machine.
CPU_KV_CACHE_GIB = 1.0
# The variable a CPU plan's env sets to the cache its context was sized for (GiB; vLLM 0.32
# reads it with int(): platforms/cpu.py), and render gives the engine.
CPU_KV_ENV = "VLLM_CPU_KVCACHE_SPACE"


@dataclass(frozen=True)
class Policy:
    workload: Workload = "interactive"
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
    # CPU engine only: the user's VLLM_CPU_KVCACHE_SPACE (GiB); None: the plan sizes the cache
    # (plan.cpu_kv_space) and render sets the variable to what the plan's env says
    cpu_kv_cache_gib: float | None = None
    # vLLM flags among the user's own (after --) that change what fits: the planner sizes with
    # them instead of refusing what they make fit
    kv_cache_bytes: int = 2  # --kv-cache-dtype fp8*: 1
    fp8_weights: bool = False  # --quantization fp8 on a 16-bit checkpoint: quantized at load
    cpu_offload_gib: float = 0.0  # --cpu-offload-gb: weights per GPU kept in CPU memory
    # this model's kernel tables kept on this machine (`probe --measure --model`): candidates
    # they cover are predicted from them, the rest by the roofline
    kernels: tuple[KernelTable, ...] = field(default=(), compare=False, repr=False)
    # the largest step vLLM runs from a captured CUDA graph, from the user's own flags (after
    # --; cli/planopts.engine_graph_tokens); None: vLLM's default (graph_steps)
    graph_tokens: int | None = None
    # the vLLM the GPU engine will be started with (the CLI reads it: engine/detect.served_vllm;
    # default: the release the planner's figures were logged on): how much of the KV budget
    # its start-up takes for CUDA graphs (families.vllm_graph_estimate, through cuda_graphs)
    vllm: ServedVllm = LOGGED_VLLM
    # whether kv_cache_bytes is the user's own --kv-cache-dtype (not auto), which always wins;
    # else auto's, which the served release may resolve to the checkpoint's FP8 (kvdtype)
    kv_cache_given: bool = False

    @property
    def cuda_graphs(self) -> cudagraphs.Requested:
        """What decides the served engine's CUDA graphs: the flags' range, else vLLM's default
        rule over ``max_num_seqs`` (launcher.planner.cudagraphs, the one place of that rule;
        each layout resolves it on its GPUs), and the served release, which sizes their
        memory."""
        return cudagraphs.Requested(self.graph_tokens, self.max_num_seqs,
                                    vllm=self.vllm.release)

    @property
    def graph_steps(self) -> int:
        """Steps of at most this many tokens replay CUDA graphs; longer ones run eagerly:
        the flags' figure, else vLLM's default capture range, min(2 x max_num_seqs, 512), on
        GPUs other than data-centre Blackwell (:attr:`cuda_graphs`)."""
        return self.cuda_graphs.max_tokens

    @property
    def streams(self) -> int:
        if self.concurrency is not None:
            return max(1, self.concurrency)
        return 1 if self.workload == "interactive" else 32


@dataclass(frozen=True)
class Scores:
    interactive: float  # 1.0 = the fastest end-to-end single request among the candidates
    throughput: float  # 1.0 = the highest aggregate tok/s at the policy's concurrency


# Why a candidate cannot run. "recorded": read back from a plan file, which keeps only the prose.
RejectionKind = Literal["heads", "kv_heads", "layers", "no_gpu_set", "no_room", "memory",
                        "recorded"]


@dataclass(frozen=True)
class Rejection:
    """Why a candidate cannot run, as the numbers that decide it; :attr:`reason` says it."""

    kind: RejectionKind
    tp: int = 1
    pp: int = 1
    count: int = 0  # heads, KV heads or layers the shape cannot divide ("heads" ... "layers")
    # "memory": per GPU, with the context asked for (``tokens``), against what vLLM may take
    need_gib: float = 0.0
    weights_gib: float = 0.0
    kv_gib: float = 0.0
    overhead_gib: float = 0.0
    tokens: int = 0
    have_gib: float = 0.0
    utilization: float = 0.0  # the --gpu-memory-utilization the GPUs can start with
    lowered: bool = False  # below the one asked for: other processes hold memory
    card_gib: float = 0.0  # the smallest card, and its name
    card: str = ""
    held: tuple[memfit.Held, ...] = ()  # "no_room", "memory": what other processes hold
    text: str = ""  # "recorded": the prose a plan file holds

    @property
    def reason(self) -> str:
        held = ", ".join(h.describe() for h in self.held)
        if self.kind == "heads":
            return f"TP={self.tp}: {self.count} attention heads are not divisible by {self.tp}"
        if self.kind == "kv_heads":
            return (f"TP={self.tp}: {self.count} KV heads can be neither split nor replicated "
                    f"over {self.tp}")
        if self.kind == "layers":
            return f"PP={self.pp}: more stages than the {self.count} layers"
        if self.kind == "no_gpu_set":
            return "no GPU set of this size"
        if self.kind == "no_room":
            return f"no room left by other processes: {held} in use"
        if self.kind == "memory":
            others = f"; other processes hold {held}" if self.lowered else ""
            return (f"needs {self.need_gib} GiB per GPU ({self.weights_gib} weights + "
                    f"{self.kv_gib} KV for {self.tokens} tokens + {self.overhead_gib} overhead), "
                    f"has {self.have_gib} GiB ({self.utilization:g} × {self.card_gib} GiB of "
                    f"{self.card}{others})")
        return self.text


@dataclass(frozen=True)
class Candidate:
    mode: Mode
    tp: int
    pp: int
    dp: int
    gpus: tuple[int, ...]  # ordered as vLLM ranks them: replica, then stage, then TP rank
    transport: Transport
    predicted: Prediction | None = None
    rejection: Rejection | None = None
    scores: Scores | None = None
    max_model_len: int | None = None
    need_gib: float = 0.0  # per GPU, with the context asked for (or the minimum)
    budget_gib: float = 0.0  # per GPU, smallest card × gpu_memory_utilization
    # what vLLM is started with on these GPUs: the asked one, or lower where other processes
    # hold memory (memfit.startable_utilization)
    gpu_memory_utilization: float = 0.9
    # The memory fit the candidate was judged by, kept so that the explanation and the
    # alternatives read it instead of fitting again (None: read from a plan file, or rejected
    # before sizing).
    fit: Fit | None = field(default=None, compare=False, repr=False)
    # what other processes hold on these GPUs below the asked utilization, as read when the
    # candidate was sized (explain says it from here)
    held: tuple[memfit.Held, ...] = field(default=(), compare=False, repr=False)
    # the kernel table the prediction came from (None: the roofline's)
    kernel_table: KernelTable | None = field(default=None, compare=False, repr=False)

    @property
    def rejected(self) -> str | None:
        """Why it cannot run, in words (None: it can)."""
        return None if self.rejection is None else self.rejection.reason


# vLLM's --distributed-executor-backend values a plan may name ("ray": over nodes on Ray)
DistributedBackend = Literal["ray", "mp"]
BACKENDS: tuple[DistributedBackend, ...] = get_args(DistributedBackend)


@dataclass(frozen=True)
class EngineSettings:
    """What the chosen layout needs of vLLM beyond its shape, typed: engine/render gives each
    as its flag (explain.settings says why each is set)."""

    # vLLM's custom all-reduce needs CUDA IPC between the TP GPUs (P2P, or NVLink everywhere)
    disable_custom_all_reduce: bool = False
    distributed_backend: DistributedBackend | None = None  # None: vLLM chooses


@dataclass(frozen=True)
class Plan:
    mode: Mode
    tp: int
    pp: int
    dp: int
    gpus: tuple[int, ...]
    engine: EngineKind
    transport: Transport
    predicted: Prediction
    reasons: tuple[str, ...]
    candidates: tuple[Candidate, ...]
    max_model_len: int
    model: str
    family: str
    workload: Workload
    gpu_memory_utilization: float = 0.9
    nodes: int = 1
    env: Mapping[str, str] = field(default_factory=dict)
    settings: EngineSettings = EngineSettings()  # the vLLM settings the layout needs
    # where the host timing's pace is unsteady: each figure of ``predicted`` that moves at the
    # timing's rounds' speed, (low, high) between the two (loadsim.host_pace_span); its JSON is
    # predicted.host_pace_range. Empty: a steady pace (the figures stand as planned)
    host_pace_range: Mapping[str, tuple[float, float]] = field(default_factory=dict)


def cpu_kv_cache_gib(plan: Plan) -> float:
    """The KV cache (GiB) a CPU plan's context was sized for: its env's, else (a plan saved
    before the plan carried it) CPU_KV_CACHE_GIB, the one such a plan was sized for."""
    try:
        return float(plan.env.get(CPU_KV_ENV, CPU_KV_CACHE_GIB))
    except ValueError:
        return CPU_KV_CACHE_GIB


def mode_name(tp: int, pp: int, dp: int) -> Mode:
    if dp > 1:
        return "dp"
    if (tp, pp) == (1, 1):
        return "single"
    return "tp" if pp == 1 else "pp" if tp == 1 else "tp+pp"


def gib(n: float) -> float:
    return round(n / GIB, 1)


def shape_label(c: Candidate) -> str:
    return f"{c.mode} TP={c.tp} PP={c.pp} DP={c.dp}"


def label(c: Candidate) -> str:
    parts = [f"TP={c.tp}"] if c.tp > 1 else []
    parts += [f"PP={c.pp}"] if c.pp > 1 else []
    parts += [f"DP={c.dp}"] if c.dp > 1 else []
    gpus = ",".join(str(g) for g in c.gpus)
    return (
        f"{' '.join(parts) or 'one GPU'} [GPU {gpus}] over {c.transport}"
        if c.tp * c.pp > 1
        else f"{' '.join(parts) or 'one GPU'} [GPU {gpus}]"
    )
