"""The vLLM engine command as one typed value, turned into argv in one place. Pure.

Every stage that decides part of the command — the plan, `serve`'s options, the CPU path, the
replica split, a fallback after a refused start — makes a changed copy with
``dataclasses.replace``; only :meth:`EngineCommand.argv` writes strings. It puts the user's own
extra flags last because vLLM keeps the last occurrence of a flag, so the user's always win.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from launcher.errors import EngineError
from topocommon import jsontext

# Flags whose value is a JSON object: a setting of ours is merged into the user's object instead
# of being given twice (vLLM would keep only one of the two).
COMPILATION_CONFIG = "--compilation-config"
# The spellings vLLM's parser takes for it (its short alias, and `_` for `-` in a long flag):
# a user's value under any of them is the one vLLM keeps, so ours is merged into it.
COMPILATION_CONFIG_SPELLINGS = (COMPILATION_CONFIG, "--compilation_config", "-cc")


@dataclass(frozen=True)
class NodePlace:
    """Where one engine command runs in a group of nodes under vLLM's own multi-node executor:
    every node runs the same command with its own rank; the head (rank 0) serves the API, the
    others run headless (their workers only)."""

    nodes: int
    rank: int
    master_addr: str
    master_port: int

    @property
    def headless(self) -> bool:
        return self.rank > 0


@dataclass(frozen=True)
class EngineCommand:
    model: str
    host: str
    port: int
    served_name: str | None = None
    revision: str | None = None  # of a hub model: the one the plan was made from
    tp: int = 1
    pp: int = 1
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None  # None: vLLM's default (the CPU engine)
    prefix_caching: bool = True
    chunked_prefill: bool = True
    tool_parser: str | None = None
    trust_remote_code: bool = False
    distributed_backend: str | None = None  # 'ray' on a Ray cluster; None: vLLM chooses
    place: NodePlace | None = None  # one node of several (vLLM's multi-node executor)
    disable_custom_all_reduce: bool = False
    compilation_config: Mapping[str, Any] = field(default_factory=dict)
    # flags added beyond the plan's settings (serve's media limits, an agent plan's), each one
    # the installed vLLM takes (render.py)
    layout_flags: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()  # the user's own, always last

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def with_env(self, **changes: str) -> EngineCommand:
        return replace(self, env={**self.env, **changes})

    def argv(self) -> tuple[str, ...]:
        """``vllm serve MODEL ...``: what a user would type, and what serve runs (engine.py
        turns the first three words into the interpreter's api_server module)."""
        out = ["vllm", "serve", self.model, "--host", self.host, "--port", str(self.port)]
        if self.served_name:
            out += ["--served-model-name", self.served_name]
        if self.revision:
            out += ["--revision", self.revision]
        out += ["--tensor-parallel-size", str(self.tp), "--pipeline-parallel-size", str(self.pp)]
        if self.place is not None:
            p = self.place
            out += ["--nnodes", str(p.nodes), "--node-rank", str(p.rank), "--master-addr",
                    p.master_addr, "--master-port", str(p.master_port)]
            if p.headless:
                out.append("--headless")
        if self.distributed_backend:
            out += ["--distributed-executor-backend", self.distributed_backend]
        if self.gpu_memory_utilization is not None:
            out += ["--gpu-memory-utilization", f"{self.gpu_memory_utilization:g}"]
        if self.disable_custom_all_reduce:
            out.append("--disable-custom-all-reduce")
        out += list(self.layout_flags)
        if self.max_model_len is not None:
            out += ["--max-model-len", str(self.max_model_len)]
        if self.prefix_caching:
            # With it, usage.prompt_tokens_details.cached_tokens: how much of each prompt the
            # prefix cache served, which coding agents read and show.
            out += ["--enable-prefix-caching", "--enable-prompt-tokens-details"]
        if self.chunked_prefill:
            out.append("--enable-chunked-prefill")
        if self.tool_parser:
            out += ["--enable-auto-tool-choice", "--tool-call-parser", self.tool_parser]
        if self.trust_remote_code:
            out.append("--trust-remote-code")
        extra = list(self.extra_args)
        dotted = _dotted_spelling(extra, COMPILATION_CONFIG_SPELLINGS)
        if self.compilation_config and dotted is not None:
            # vLLM gathers `FLAG.key value` flags into one object that it passes after every
            # other flag, so it replaces any whole value, ours too: ours goes in that object,
            # before the user's keys (which win where both set one).
            out += _dotted_flags(dotted, self.compilation_config)
        elif self.compilation_config:
            extra, merged = _merge_json_flag(extra, COMPILATION_CONFIG_SPELLINGS,
                                             self.compilation_config)
            if not merged:
                out += [COMPILATION_CONFIG, json.dumps(dict(self.compilation_config),
                                                       separators=(",", ":"))]
        return (*out, *extra)

    def shell_line(self, hide: Sequence[str] = ("PATH",)) -> str:
        """A copy-pasteable line: the variables the command sets, then the command."""
        shown = {k: v for k, v in sorted(self.env.items()) if k not in hide}
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in shown.items())
        return (prefix + " " if prefix else "") + shlex.join(self.argv())


def _merge_json_flag(args: list[str], spellings: tuple[str, ...], ours: Mapping[str, Any]
                     ) -> tuple[list[str], bool]:
    """Merge ``ours`` into the last ``flag VALUE`` / ``flag=VALUE`` of the user's ``args``, the
    flag under any of its ``spellings`` (ours wins key by key, the user's other keys stay).
    (new args, whether one was found). A value that is no JSON object is refused
    (:func:`_as_obj`), never read as ``{}``: that would drop the user's settings for ours."""
    for i in range(len(args) - 1, -1, -1):
        item = args[i]
        for flag in spellings:
            if item == flag and i + 1 < len(args):
                out = list(args)
                out[i + 1] = json.dumps(deep_merge(_as_obj(flag, args[i + 1]), ours))
                return out, True
            if item.startswith(flag + "="):
                value = item[len(flag) + 1:]
                out = list(args)
                out[i] = f"{flag}={json.dumps(deep_merge(_as_obj(flag, value), ours))}"
                return out, True
    return args, False


def _dotted_spelling(args: Sequence[str], spellings: tuple[str, ...]) -> str | None:
    """The spelling of the user's last ``FLAG.key`` flag (``--compilation-config.mode 3``), as
    vLLM's parser writes it (``_`` as ``-`` in a long flag's name), or None when none is given."""
    for item in reversed(args):
        for flag in spellings:
            if item.startswith(flag + "."):
                return flag.replace("_", "-")
    return None


def _dotted_flags(flag: str, ours: Mapping[str, Any], path: str = "") -> list[str]:
    """``ours`` as ``FLAG.a.b=VALUE`` words, one per leaf (a value vLLM reads as JSON)."""
    words: list[str] = []
    for key, value in ours.items():
        if isinstance(value, Mapping) and value:
            words += _dotted_flags(flag, value, f"{path}{key}.")
        else:
            words.append(f"{flag}.{path}{key}={json.dumps(value, separators=(',', ':'))}")
    return words


# vLLM (0.32) reads this flag's value as JSON after writing out bare numbers with a size suffix
# (`[1k, 2K]`: 1000, 2048; engine/arg_utils.py _expand_json_human_readable_numbers): only outside
# JSON strings, decimal suffixes k m g t, binary K M G T (whole numbers only).
_JSON_STRING = re.compile(r'("(?:[^"\\]|\\.)*")')
_SIZED_NUMBER = re.compile(r"\b(\d+(?:\.\d+)?)([kKmMgGtT])\b")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _sized(match: re.Match[str]) -> str:
    number, suffix = match.groups()
    if suffix in _DECIMAL:
        return str(int(float(number) * _DECIMAL[suffix]))
    if "." in number:  # vLLM refuses a decimal with a binary suffix
        raise ValueError(f"{match.group()}: no decimals with a binary suffix")
    return str(int(number) * _BINARY[suffix])


def _expand_sized_numbers(text: str) -> str:
    parts = _JSON_STRING.split(text)
    parts[::2] = [_SIZED_NUMBER.sub(_sized, part) for part in parts[::2]]
    return "".join(parts)


def _as_obj(flag: str, text: str) -> dict[str, Any]:
    """The user's ``flag`` value as the JSON object vLLM reads it as. Anything else (a bare
    level such as ``3``, which older vLLMs took and 0.32 refuses; a truncated object; a list)
    is refused in one line that says what to pass: read as ``{}``, the launcher's own settings
    would silently have replaced the user's."""
    try:
        value = jsontext.loads(_expand_sized_numbers(text))
    except (ValueError, OverflowError):  # OverflowError: a sized number past a float (_sized)
        value = None
    if isinstance(value, dict):
        return value
    shown = text if len(text) <= 40 else text[:37] + "..."
    level = text.strip()
    hint = (f" (an optimization level is its own flag: -O{level})"
            if level in ("0", "1", "2", "3") else "")
    raise EngineError(
        f"{flag} {shown!r} is not a JSON object, and the launcher merges its own compilation "
        f"settings into yours: pass one, e.g. {flag} '{{\"cudagraph_mode\": \"PIECEWISE\"}}'"
        f"{hint}")


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        old = merged.get(key)
        if isinstance(value, Mapping) and isinstance(old, Mapping):
            merged[key] = deep_merge(old, value)
        else:
            merged[key] = value
    return merged


def replicas(cmd: EngineCommand, count: int, *, bind: str, first_port: int
             ) -> tuple[EngineCommand, ...]:
    """``count`` copies of one engine on their own slice of its GPUs and their own ports.

    This is how a plan's data-parallel replicas run: separate vLLM servers behind the proxy
    (which routes with prefix affinity), not vLLM's own --data-parallel-size.
    """
    devices = [d for d in cmd.env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    count = max(count, 1)
    per = len(devices) // count if devices else 0
    out = []
    for i in range(count):
        one = replace(cmd, host=bind, port=first_port + i)
        if per:
            one = one.with_env(CUDA_VISIBLE_DEVICES=",".join(devices[i * per:(i + 1) * per]))
        out.append(one)
    return tuple(out)
