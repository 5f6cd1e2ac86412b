"""A checkpoint's quantization_config, as the planner needs it: the method, the bits per weight
of the quantized layers, and the bytes of scales and zero points per weight. Pure, total: any
config, of any shape, gives an answer (see :func:`read`). And which 4-bit GEMM vLLM runs for
them on a card (:func:`mixed_input_gemm`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any


def read(cfg: Mapping[str, Any], t: Mapping[str, Any]) -> tuple[str | None, float, float]:
    """(method, bits per weight of linear layers, overhead bytes per weight for scales/zeros).

    Any quantization_config is read without failing: fields of the wrong type or out of range
    count as absent, and a method this reader does not know keeps 16 bits (the larger size, and
    the checkpoint's own size replaces it where a safetensors index gives one)."""
    q = cfg.get("quantization_config") or t.get("quantization_config")
    if not isinstance(q, Mapping):
        return None, 16.0, 0.0
    method = str(q.get("quant_method", "unknown")).lower()
    if "quant_method" not in q and _modelopt_produced(q):
        # NVIDIA ModelOpt's own export (hf_quant_config.json, or one copied into config.json)
        # names its producer, not a method; vLLM reads it as ModelOpt's
        # (model_arch_config_convertor._normalize_quantization_config)
        method = "modelopt"
    if method in ("awq", "gptq", "awq_marlin", "gptq_marlin"):
        bits = _number(q.get("bits", q.get("w_bit")), 4.0, 1, 16)
        group = _count(q.get("group_size", q.get("q_group_size")), 128, -1, 1 << 20)
        group = group if group > 0 else 4096  # -1 means one group per output channel
        # one fp16 scale and one packed zero point per group
        return method.split("_")[0], bits, (2 + bits / 8) / group
    if method in ("fp8", "fbgemm_fp8"):
        return "fp8", 8.0, 0.0
    if method == "mxfp4":
        # OCP MX: 4-bit values and one 8-bit shared scale per 32 (gpt-oss quantizes only its
        # experts this way; spec_from_config keeps the other layers at 16 bits)
        return "mxfp4", 4.0, 1 / 32
    if method.startswith("modelopt"):  # NVIDIA ModelOpt: quant_algo FP8, or NVFP4 (an FP8
        # scale per 16); vLLM names its NVFP4 config "modelopt_fp4" and takes any method so
        # begun as ModelOpt's (ModelOptQuantConfigBase._extract_modelopt_quant_algo)
        return ("modelopt", *_modelopt_bits(_modelopt_algo(q), q))
    if method == "bitsandbytes":
        return "bitsandbytes", 4.0 if q.get("load_in_4bit") is True else 8.0, 0.0
    if method == "compressed-tensors":
        return ("compressed-tensors", *_compressed_tensors_bits(q))
    return method, 16.0, 0.0


# The bytes of a scale by the dtype compressed-tensors names it ("torch.float8_e4m3fn")
_SCALE_BYTES = {"float8_e4m3fn": 1, "float8_e8m0fnu": 1, "uint8": 1, "int8": 1,
                "bfloat16": 2, "float16": 2, "float32": 4}


def _compressed_tensors_bits(q: Mapping[str, Any]) -> tuple[float, float]:
    """(bits, overhead bytes per weight) of a compressed-tensors checkpoint: its config groups'
    weights, each a scheme for the layers it targets. Which layers each targets is not
    counted, so every layer is taken at the widest group's bytes (as ModelOpt's
    MIXED_PRECISION); no group with weights: 16 bits."""
    widest: tuple[float, float] | None = None
    groups = q.get("config_groups")
    for group in groups.values() if isinstance(groups, Mapping) else ():
        w = group.get("weights") if isinstance(group, Mapping) else None
        if not isinstance(w, Mapping):
            continue
        bits = _number(w.get("num_bits"), 16.0, 1, 16)
        overhead = 0.0
        if w.get("strategy") in ("group", "tensor_group") and bits < 16:
            # a scale per group (tensor_group: NVFP4's FP8 scale per 16 weights, beside one per
            # tensor) in its scale_dtype, else 16 bits as W4A16's are stored, and a packed zero
            # point where not symmetric, beside the packed weights
            size = _count(w.get("group_size"), 128, 1, 1 << 20)
            scale = _SCALE_BYTES.get(str(w.get("scale_dtype")).removeprefix("torch."), 2)
            overhead = (scale + (0 if w.get("symmetric", True) else bits / 8)) / size
        if widest is None or bits / 8 + overhead > widest[0] / 8 + widest[1]:
            widest = (bits, overhead)
    return widest or (16.0, 0.0)


def experts_only(cfg: Mapping[str, Any], t: Mapping[str, Any]) -> bool:
    """Whether the quantization packs the routed experts only, the other linear layers kept
    at 16 bits: gpt-oss's MXFP4, and a compressed-tensors checkpoint whose ``ignore`` list
    leaves out the attention (Kimi-K2.5's INT4: ``re:.*self_attn.*``, the shared experts and
    the dense MLPs ignored), as vLLM then loads those layers unquantized."""
    q = cfg.get("quantization_config") or t.get("quantization_config")
    if not isinstance(q, Mapping):
        return False
    method = str(q.get("quant_method", "")).lower()
    if method == "mxfp4":
        return True
    ignore = q.get("ignore")
    return (method == "compressed-tensors" and isinstance(ignore, list)
            and any(isinstance(i, str) and "self_attn" in i for i in ignore))


# ------------------------------------------------ what a ModelOpt checkpoint leaves unquantized


@dataclass(frozen=True)
class Unquantized:
    """The modules a ModelOpt checkpoint names as left unquantized (its exclusion list), which
    vLLM loads at 16 bits (UnquantizedLinearMethod), matched as vLLM 0.32 matches them (see
    :meth:`excludes`). ``every``: the list could not be read, so every quantizable layer is
    taken at 16 bits (the larger size; vLLM refuses such a list at start-up). ``notes``: why an
    entry was not read as vLLM would, one line each."""

    patterns: tuple[str, ...] = ()
    every: bool = False
    notes: tuple[str, ...] = ()

    def excludes(self, module: str) -> bool:
        """Whether vLLM loads ``module`` (its checkpoint name, e.g.
        ``model.layers.0.self_attn.q_proj``; a mixture's experts as the one module
        ``model.layers.0.mlp.experts``) unquantized, by the rules of
        ModelOptQuantConfigBase.is_layer_excluded (vllm/model_executor/layers/quantization/
        modelopt.py): an entry equal to the module's name or to its fused name (q/k/v_proj ->
        qkv_proj, gate/up_proj -> gate_up_proj: is_layer_skipped's exact match); an entry
        found anywhere in the name (its substring rule for older ModelOpt exports, also with
        a leading ``language_model.`` dropped); an entry that matches the name as a
        shell-style wildcard (fnmatch); and for an experts module, any entry that holds its
        name (is_layer_skipped's experts rule: one excluded expert excludes the fused MoE).
        Where the model class has an hf_to_vllm_mapper vLLM first rewrites ``X*`` as ``X``
        and ``X.*`` (apply_vllm_mapper); whether it has one depends on the class, so both
        readings are taken, the module excluded if either excludes it (the larger size)."""
        if self.every:
            return True
        names = _aliases(module)
        return any(_entry_excludes(entry, name) for entry in self._entries() for name in names)

    def _entries(self) -> tuple[str, ...]:
        out = list(self.patterns)
        for p in self.patterns:  # apply_vllm_mapper's rewrite of a trailing "*"
            if len(p) >= 2 and p[-1] == "*" and p[-2] != ".":
                out += [p[:-1], p[:-1] + ".*"]
        return tuple(out)


# vLLM fuses these checkpoint modules into one layer and matches the fused name too
_FUSED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj",
          "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj"}
# A multimodal model's language model is named ``model.language_model.`` by transformers 5 and
# ``language_model.model.`` in older checkpoints (and vLLM's own classes): an exclusion
# written against either names the same layers
_LANGUAGE_MODEL = ("model.language_model.", "language_model.model.")


def _aliases(module: str) -> tuple[str, ...]:
    """``module``'s name as vLLM may see it: itself, its fused layer's, and the other spelling
    of a multimodal model's language model."""
    names = [module]
    head, _, last = module.rpartition(".")
    if last in _FUSED:
        names.append(f"{head}.{_FUSED[last]}" if head else _FUSED[last])
    for a, b in (_LANGUAGE_MODEL, _LANGUAGE_MODEL[::-1]):
        names += [n.replace(a, b, 1) for n in list(names) if n.startswith(a)]
    return tuple(names)


def _entry_excludes(entry: str, name: str) -> bool:
    """One exclusion entry against one spelling of a module's name (see Unquantized.excludes)."""
    if entry == name or entry in name or fnmatchcase(name, entry):
        return True
    if name.startswith("language_model.") and entry in name.removeprefix("language_model."):
        return True
    # a mixture's experts (one fused layer in vLLM): excluded where an entry names one of them
    # (is_layer_skipped takes any module named with "experts" so)
    return "experts" in name and "experts" in entry and name in entry


def modelopt_unquantized(cfg: Mapping[str, Any], t: Mapping[str, Any]) -> Unquantized | None:
    """The modules a ModelOpt checkpoint leaves unquantized, read where vLLM reads them
    (ModelOptQuantConfigBase.from_config): the ``exclude_modules`` of its ``quantization``
    block (hf_quant_config.json, or a copy of it in config.json), else config.json's own
    ``ignore`` list. None for any other checkpoint. Total: a list or entry that cannot be
    read gives the larger size and a note, never an exception.

    A top-level ``exclude_modules`` beside no ``quantization`` block is not where vLLM looks
    (it then quantizes those modules, and a checkpoint that stores them at 16 bits does not
    load); it is read too, with a note, as the larger size."""
    q = cfg.get("quantization_config") or t.get("quantization_config")
    if not isinstance(q, Mapping):
        return None
    method = str(q.get("quant_method", "")).lower()
    if not (method.startswith("modelopt") or ("quant_method" not in q and _modelopt_produced(q))):
        return None
    notes: list[str] = []
    if "quantization" in q:
        inner = q.get("quantization")
        if not isinstance(inner, Mapping):
            return Unquantized(every=True, notes=(
                "ModelOpt's quantization block is not an object (vLLM refuses it): every "
                "layer sized at 16 bits",))
        lists = [("exclude_modules", inner.get("exclude_modules", []))]
    else:
        lists = [("ignore", q.get("ignore", []))]
        if "exclude_modules" in q:
            lists.append(("exclude_modules", q.get("exclude_modules")))
            notes.append("exclude_modules outside a quantization block is not read by vLLM "
                         "(it reads 'ignore' there); its modules are sized at 16 bits, the "
                         "checkpoint's as stored")
    patterns: list[str] = []
    for key, value in lists:
        if not isinstance(value, list):
            return Unquantized(every=True, notes=(*notes, (
                f"ModelOpt's {key} is a {type(value).__name__}, not a list (vLLM refuses it): "
                "every layer sized at 16 bits"),))
        odd = [v for v in value if not isinstance(v, str)]
        if odd:
            return Unquantized(every=True, notes=(*notes, (
                f"ModelOpt's {key} holds {len(odd)} "
                f"{'entry' if len(odd) == 1 else 'entries'} other than a module name "
                f"({_short(odd[0])}; vLLM fails on it): every layer sized at 16 bits"),))
        if "" in value:
            notes.append(f"ModelOpt's {key} holds an empty entry, which vLLM finds in every "
                         "module's name (its substring rule): every layer sized at 16 bits")
        patterns += value
    return Unquantized(tuple(patterns), False, tuple(notes))


def unquantized_params(exclusions: Unquantized, modules: Iterable[tuple[str, int]]) -> int:
    """The parameters of ``modules`` ((name, parameters) of each quantizable layer) that
    ``exclusions`` leaves at 16 bits."""
    return sum(n for name, n in modules if exclusions.excludes(name))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _modelopt_produced(q: Mapping[str, Any]) -> bool:
    producer = q.get("producer")
    return isinstance(producer, Mapping) and producer.get("name") == "modelopt"


def _modelopt_algo(q: Mapping[str, Any]) -> str:
    """ModelOpt's quant_algo: in its ``quantization`` block (hf_quant_config.json) or at the top
    (ModelOpt 0.31 and later, inside config.json)."""
    inner = q.get("quantization")
    algo = inner.get("quant_algo") if isinstance(inner, Mapping) else q.get("quant_algo")
    return str(algo or "").upper()


def _modelopt_bits(algo: str, q: Mapping[str, Any]) -> tuple[float, float]:
    """(bits, overhead bytes per weight) of a ModelOpt quant_algo. MIXED_PRECISION names an
    algo per layer (``quantized_layers``): the widest of them is taken for every layer, the
    larger size where the split between them is not counted."""
    if algo == "MIXED_PRECISION":
        inner = q.get("quantization")
        layers = (inner if isinstance(inner, Mapping) else q).get("quantized_layers")
        algos = {str(v.get("quant_algo") or "").upper() for v in layers.values()
                 if isinstance(v, Mapping)} if isinstance(layers, Mapping) else set()
        widest = max((_modelopt_bits(a, q) for a in algos if a != "MIXED_PRECISION"),
                     default=(16.0, 0.0))
        return widest
    if "NVFP4" in algo or "FP4" in algo:
        return 4.0, 1 / 16
    if "FP8" in algo:
        return 8.0, 0.0
    return 16.0, 0.0


def _count(value: Any, default: int, low: int, high: int) -> int:
    """``value`` as a whole number within [low, high], else ``default``: a group of 1.5 weights
    is no group (read as one, it sized each weight with a scale of its own)."""
    number = _number(value, default, low, high)
    return int(number) if number == int(number) else default


def _number(value: Any, default: float, low: float, high: float) -> float:
    """``value`` as a number within [low, high], else ``default`` (configs are not checked)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    return float(value) if low <= value <= high else default



# --------------------------------------------------- what vLLM holds of an AWQ checkpoint

# vLLM runs an AWQ checkpoint's linear layers through AutoAWQMarlinLinearMethod, which repacks
# each after loading for the mixed-input kernel it picks (below). Machete, Hopper's kernel, takes
# its zero points unpacked in the activations' 16 bits with the scale applied, -scale x zero
# (vllm/model_executor/kernels/linear/mixed_precision/machete.py, transform_w_zp): 2 bytes a
# group and output column where the checkpoint packs bits / 8. Marlin keeps them packed, so the
# Hopper layout is the larger and the one taken (the card is not known when a model is sized).
MACHETE_ZERO_BYTES = 2
# Machete's prepacked tiles: it implements a layer whose input features divide by 64 and output
# features by 128 (machete_utils.check_machete_supports_shape), with groups of 64 or 128 or one
# group a column; any other layer runs on Marlin, zero points packed.
MACHETE_BLOCK = (64, 128)
MACHETE_GROUPS = (-1, 64, 128)
# The repacking allocates the layer's weights and zero points afresh through PyTorch's caching
# allocator, mostly in blocks its own temporaries (the weights unpacked to int32, 8x their size)
# freed. A block of the large pool (over 1 MiB) is split only where more than 1 MiB would be
# left (CUDACachingAllocator's kSmallSize); otherwise the whole block is the tensor's and counts
# in torch's allocated bytes, vLLM's "Model loading took". Where that remainder falls depends
# on every earlier allocation; each repacked large tensor is taken to hold half of it, its mean.
ALLOCATOR_SPLIT_BYTES = 1 << 20


def zero_point_groups(cfg: Mapping[str, Any], t: Mapping[str, Any]) -> tuple[int, float] | None:
    """(group size, bits) of a 4-bit AWQ checkpoint that stores zero points, else None (vLLM's
    AutoAWQConfig loads 4 bits alone, its TYPE_MAP). A group of -1 (one a column) is -1."""
    q = cfg.get("quantization_config") or t.get("quantization_config")
    if not isinstance(q, Mapping) or str(q.get("quant_method", "")).lower() not in (
            "awq", "awq_marlin"):
        return None
    if q.get("zero_point", True) is not True:
        return None
    bits = _number(q.get("bits", q.get("w_bit")), 4.0, 1, 16)
    if bits != 4:
        return None
    group = _count(q.get("group_size", q.get("q_group_size")), 128, -1, 1 << 20)
    return (group if group > 0 else -1), bits


@dataclass(frozen=True)
class LoadGrowth:
    """Bytes vLLM holds beyond an AWQ checkpoint's own once it has repacked the 4-bit layers."""

    machete_zeros: int  # the zero points' 16 bits over their packed bits: Machete's alone
    allocator: int  # blocks the caching allocator did not split: any repacking kernel's

    @property
    def total(self) -> int:
        return self.machete_zeros + self.allocator


def awq_load_growth(matrices: Mapping[tuple[int, int], int], group: int,
                    bits: float) -> LoadGrowth:
    """What vLLM holds beyond an AWQ checkpoint's bytes for its 4-bit linear layers
    ``matrices`` ((input features, output features): how many), once repacked for Machete: the
    zero points' 16 bits over their packed ``bits`` (MACHETE_ZERO_BYTES), and half of
    ALLOCATOR_SPLIT_BYTES for each repacked tensor of the allocator's large pool (the weights,
    the zero points). A layer Machete cannot run (MACHETE_BLOCK, MACHETE_GROUPS) is left at the
    checkpoint's bytes."""
    if group not in MACHETE_GROUPS:
        return LoadGrowth(0, 0)
    zeros = slack = 0.0
    for (k, n), count in matrices.items():
        if k <= 0 or n <= 0 or k % MACHETE_BLOCK[0] or n % MACHETE_BLOCK[1]:
            continue
        groups = 1 if group == -1 else -(-k // group)
        unpacked = groups * n * MACHETE_ZERO_BYTES
        large = (k * n * bits / 8 > ALLOCATOR_SPLIT_BYTES) + (unpacked > ALLOCATOR_SPLIT_BYTES)
        zeros += count * groups * n * (MACHETE_ZERO_BYTES - bits / 8)
        slack += count * large * ALLOCATOR_SPLIT_BYTES / 2
    return LoadGrowth(int(zeros), int(slack))

# ------------------------------------------------------------- which 4-bit GEMM vLLM runs

# vLLM runs an AWQ/GPTQ checkpoint's linear layers through the first mixed-input kernel that
# can implement them on the card (vllm/model_executor/kernels/linear/mixed_precision,
# choose_mp_linear_kernel; the H200 run of 2026-12-02 logged "Using MacheteLinearKernel for
# AutoAWQMarlinLinearMethod"): Machete where the compute capability is exactly 9.0
# (MacheteLinearKernel.can_implement), else Marlin from 7.5 (MarlinLinearKernel's minimum).
MACHETE_CC = (9, 0)
MARLIN_MIN_CC = (7, 5)
# Marlin's tensor-core tiles are 16 rows, four to a pass over the weights (its kernel,
# csrc/quantization/gptq_marlin: a problem of more rows runs as ``par`` problems of 64 rows
# each, and each streams and dequantizes every weight again).
MARLIN_ROWS_PER_PASS = 64
# The 4-bit GEMMs a decoder layer runs, each one mixed-input kernel: the attention's QKV and
# output projections and the MLP's gate_up and down (a mixture-of-experts layer's two grouped
# expert GEMMs in place of the last two; its router stays at 16 bits). Each pays the kernel's
# fixed cost (hardware.QUANT_GEMM_FIXED_S) besides its bytes (costmodel.decode_step_s).
MIXED_INPUT_GEMMS_PER_LAYER = 4


@dataclass(frozen=True)
class MixedInputGemm:
    """The 4-bit GEMM vLLM runs on a card, and how often it passes over the weights."""

    kernel: str  # "machete", "marlin"
    rows_per_pass: int | None  # rows one pass over the weights serves; None: all of them
    why: str

    def passes(self, rows: float) -> float:
        """Passes over the weights (each read and dequantized) for ``rows`` rows."""
        if self.rows_per_pass is None:
            return 1.0
        return float(max(1, -(-int(rows) // self.rows_per_pass)))


def mixed_input_gemm(cc: tuple[int, int] | None) -> MixedInputGemm:
    """The kernel vLLM picks for a 4-bit AWQ/GPTQ layer on a card of compute capability ``cc``
    (None: not known, Marlin assumed, the kernel of every CUDA card but Hopper)."""
    if cc == MACHETE_CC:
        return MixedInputGemm(
            "machete", None,
            "Machete (Hopper): TMA loads each weight tile once, the consumer warps dequantize "
            "it in registers and feed it to wgmma as its A operand with the rows as B, so one "
            "pass over the weights serves every row and the math runs on the bf16 tensor cores")
    return MixedInputGemm(
        "marlin", MARLIN_ROWS_PER_PASS,
        f"Marlin: every {MARLIN_ROWS_PER_PASS} rows are their own pass, which streams and "
        "dequantizes all of the weights again" + ("" if cc is None or cc >= MARLIN_MIN_CC else
                                                  " (below 7.5 vLLM has no Marlin: assumed)"))


def kv_cache_quantized(cfg: Mapping[str, Any], t: Mapping[str, Any]) -> tuple[int | None,
                                                                             tuple[str, ...]]:
    """(bytes per KV element, notes): the KV cache a checkpoint's quantization config asks
    vLLM's ``--kv-cache-dtype auto`` for, read where vLLM 0.32 reads it; None where it asks for
    none this planner sizes (the model's dtype then). Total: a key of the wrong shape gives None
    and a note, never an exception.

    ModelOpt (vllm/utils/torch_utils.get_kv_cache_quant_algo_string): the first set of
    ``kv_cache_scheme`` and ``kv_cache_quant_algo``, in the ``quantization`` block then at the
    top; "FP8", or a scheme ``{"dynamic": false, "num_bits": 8, "type": "float"}``, is fp8_e4m3.
    compressed-tensors (attention.Attention.__init__): any ``kv_cache_scheme`` makes auto fp8;
    only an 8-bit float one is taken at one byte here, another keeps 2 (the larger) with a note.
    NVFP4 KV is not sized: 2 bytes, with a note."""
    q = cfg.get("quantization_config") or t.get("quantization_config")
    if not isinstance(q, Mapping):
        return None, ()
    method = str(q.get("quant_method", "")).lower()
    if method == "compressed-tensors":
        scheme = q.get("kv_cache_scheme")
        if scheme is None:
            return None, ()
        if isinstance(scheme, Mapping) and scheme.get("type") == "float" \
                and scheme.get("num_bits") == 8:
            return 1, ()
        return None, (f"compressed-tensors kv_cache_scheme {_short(scheme)} is no 8-bit float "
                      "scheme (vLLM makes --kv-cache-dtype auto fp8 for any): KV sized at 2 "
                      "bytes per element, the larger",)
    if not (method.startswith("modelopt") or ("quant_method" not in q and _modelopt_produced(q))):
        return None, ()
    inner = q.get("quantization", q)
    if not isinstance(inner, Mapping):
        return None, ()  # vLLM refuses the checkpoint; modelopt_unquantized says so
    algo = (inner.get("kv_cache_scheme") or q.get("kv_cache_scheme")
            or inner.get("kv_cache_quant_algo") or q.get("kv_cache_quant_algo"))
    if not algo:
        return None, ()
    if isinstance(algo, Mapping):
        if algo.get("dynamic") is False and algo.get("num_bits") == 8 \
                and algo.get("type") == "float":
            return 1, ()
        name = "NVFP4" if algo.get("num_bits") == 4 and algo.get("type") == "float" else None
    elif isinstance(algo, str):
        if algo.lower() == "fp8":
            return 1, ()
        name = "NVFP4" if algo.lower() == "nvfp4" else None
    else:
        name = None
    if name:
        return None, ("ModelOpt asks for an NVFP4 KV cache, which this planner does not size: "
                      "KV sized at 2 bytes per element, the larger",)
    return None, (f"ModelOpt's KV cache setting {_short(algo)} is not one vLLM maps (it keeps "
                  "the model's dtype): KV sized at 2 bytes per element",)
