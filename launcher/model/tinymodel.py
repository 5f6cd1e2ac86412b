"""The embedded default model: a tiny random-weight Llama with a locally trained BPE tokenizer.

No model can be downloaded on the machines toposerve is developed and tested on, so the default
model is generated here, with the real Hugging Face saving code, and loaded by vLLM exactly as a
downloaded model would be. Generation is deterministic (fixed seed, sorted corpus) and happens once:
the result is cached and reused.

The tokenizer is a byte-level BPE trained on Python's own standard library sources, which gives a
coding agent's kind of text sensible tokens. The chat template follows Llama 3's header format and
renders tool definitions, so tool-calling requests pass through vLLM's template step.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import sysconfig
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from launcher.errors import ModelError
from topocommon import jsontext

# Bump when anything below changes what is generated, so an old cache is not reused.
RECIPE_VERSION = 1
SERVED_NAME = "toposerve-tiny"

SPECIAL_TOKENS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
)

CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if tools %}"
    "<|start_header_id|>system<|end_header_id|>\n\n"
    "You may call these tools by answering with JSON "
    '{"name": ..., "parameters": ...}:\n'
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}<|eot_id|>"
    "{%- endif %}"
    "{%- for message in messages %}"
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{%- if message['content'] is string %}{{ message['content'] }}"
    "{%- elif message['content'] %}"
    "{%- for part in message['content'] %}{%- if part['type'] == 'text' %}{{ part['text'] }}"
    "{%- endif %}{%- endfor %}"
    "{%- endif %}"
    "{%- if message.get('tool_calls') %}"
    "{%- for call in message['tool_calls'] %}{{ call['function'] | tojson }}{%- endfor %}"
    "{%- endif %}"
    "<|eot_id|>"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{%- endif %}"
)


@dataclass(frozen=True)
class TinyRecipe:
    """What the generated model looks like. Small enough to start fast on two CPU cores, shaped
    like a real Llama (GQA, RoPE, SwiGLU) so that every code path of the engine is exercised."""

    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int = 688
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 4096
    corpus_bytes: int = 4_000_000
    seed: int = 0
    version: int = RECIPE_VERSION

    def fingerprint(self) -> str:
        return "-".join(f"{v}" for v in asdict(self).values())


def default_cache_dir(env: Mapping[str, str]) -> Path:
    if env.get("TOPOSERVE_CACHE"):
        return Path(env["TOPOSERVE_CACHE"])
    xdg = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "toposerve"


def model_dir(cache_dir: Path, recipe: TinyRecipe) -> Path:
    return cache_dir / "models" / f"tiny-llama-v{recipe.version}"


def ensure_tiny_model(
    env: Mapping[str, str] | None = None, recipe: TinyRecipe | None = None
) -> Path:
    """Return the directory of the embedded model, generating it on first use. A cache it
    cannot be made in (a file where the folder should be, no write access) is a
    :class:`ModelError` naming the folder, for serve, tune and `probe --measure` alike."""
    env = os.environ if env is None else env
    recipe = recipe or TinyRecipe()
    cache = default_cache_dir(env)
    try:
        return _ensure(model_dir(cache, recipe), recipe)
    except OSError as exc:
        raise ModelError(
            f"cannot make the embedded model in {cache} ({exc.strerror or exc}): set "
            "TOPOSERVE_CACHE to a folder you can write, or pass --model") from None


def _ensure(target: Path, recipe: TinyRecipe) -> Path:
    stamp = target / "toposerve-recipe.json"
    if _stamp_matches(stamp, recipe):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename, so a half-written model is never picked up.
    staging = Path(tempfile.mkdtemp(prefix=".tiny-", dir=target.parent))
    try:
        _generate(staging, recipe)
        (staging / "toposerve-recipe.json").write_text(
            json.dumps({"fingerprint": recipe.fingerprint(), "recipe": asdict(recipe)}, indent=1)
        )
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _stamp_matches(stamp: Path, recipe: TinyRecipe) -> bool:
    """Whether ``stamp`` says the model beside it was made from ``recipe``. A stamp that is
    missing, unreadable or damaged (a disk filled mid-write, a hand edit) says no, so the model
    is made again rather than the serve ending in a traceback."""
    try:
        data = jsontext.loads(stamp.read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("fingerprint") == recipe.fingerprint()


def _corpus(limit_bytes: int) -> Iterator[str]:
    """Python standard-library sources in a fixed order, up to ``limit_bytes``."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py") if p.is_file())
    files += sorted(p for p in stdlib.glob("*/*.py") if "test" not in p.parts[-2])
    used = 0
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        yield text
        used += len(text)
        if used >= limit_bytes:
            return


def _generate(out: Path, recipe: TinyRecipe) -> None:
    try:
        import torch
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        # Typed loosely on purpose: transformers' stubs change between major versions.
        transformers: Any = importlib.import_module("transformers")
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ModelError(
            f"cannot generate the embedded model: {exc.name} is not installed; "
            "install the engine with `pip install -e '.[cpu]'` (or '.[gpu]')"
        ) from exc

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=recipe.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(recipe.corpus_bytes), trainer=trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        pad_token="<|end_of_text|>",
        model_max_length=recipe.max_position_embeddings,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    torch.manual_seed(recipe.seed)
    config = transformers.LlamaConfig(
        vocab_size=len(fast),
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_hidden_layers,
        num_attention_heads=recipe.num_attention_heads,
        num_key_value_heads=recipe.num_key_value_heads,
        max_position_embeddings=recipe.max_position_embeddings,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False,
        dtype="bfloat16",
    )
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
