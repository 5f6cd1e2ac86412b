"""`--workload agent --sessions S --context D` for plan, serve and tune: the options, read into
the request's AgentAsk, and the host's free memory (the agent plan itself: launcher.planner.agent,
made by launcher.pipeline.run)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from decimal import Decimal

from launcher.errors import PlanError
from launcher.planner.agent import AgentAsk

AGENT = "agent"
# loadgen's convention (--depth 8k,32K): k and m are ×1000, K and M ×1024
_TOKENS = re.compile(r"(\d{1,12})(?:\.(\d{1,6}))?([kKmM]?)")
_SCALE = {"": 1, "k": 10**3, "m": 10**6, "K": 2**10, "M": 2**20}
MAX_TOKENS = 10**8  # past every model's context by far; a typo, not a plan


def tokens(text: str) -> int:
    """A token count: '64k' 64000, '64K' 65536, '1.5k' 1500, '32768'; at least 1."""
    return _token_count(text, 1)


def _token_count(text: str, least: int) -> int:
    match = _TOKENS.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"expected a token count like 32768, 64k (x1000) or 64K (x1024), not {text!r}")
    whole, frac, suffix = match.groups()
    value = Decimal(f"{whole}.{frac or 0}") * _SCALE[suffix]
    if value != value.to_integral_value():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of tokens")
    if not least <= value <= MAX_TOKENS:
        raise argparse.ArgumentTypeError(f"a token count from {least} to {MAX_TOKENS:,}, "
                                         f"not {text!r}")
    return int(value)


def sessions(text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of sessions, not {text!r}"
                                         ) from None
    if not 1 <= value <= 4096:
        raise argparse.ArgumentTypeError(f"sessions from 1 to 4096, not {value}")
    return value


def add_agent_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sessions", type=sessions, metavar="S",
                   help="--workload agent: coding-agent sessions served at once (default 1)")
    p.add_argument("--context", type=tokens, metavar="D",
                   help="--workload agent: the prefix each session keeps, in tokens (64k = "
                   "64000, 64K = 65536): what a turn's first token waits on")
    p.add_argument("--think", type=think_seconds, metavar="SECONDS", default=1.0,
                   help="--workload agent: seconds between a session's answer and its next "
                   "turn, the sessions starting that far apart over one of them, as loadgen "
                   "--think sends them (default 1); 0: each sends again at once")
    p.add_argument("--system-tokens", type=system_tokens, metavar="N",
                   help="--workload agent: a system prompt of N tokens every session opens with, "
                   "the same in all and so cached across sessions, as loadgen --system-tokens "
                   "sends it (loadgen's default is a quarter of turn 1; here 0 or off: none "
                   "assumed)")


def system_tokens(text: str) -> int:
    """--system-tokens: a token count as :func:`tokens` reads it, or 0 / 'off' / 'none' for no
    system prompt (loadgen's parse_system_tokens reads the same texts the same way)."""
    if text.strip().lower() in ("off", "none"):
        return 0
    return _token_count(text, 0)


def think_seconds(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, not {text!r}") from None
    if not 0 <= value <= 86400:
        raise argparse.ArgumentTypeError(f"a think time from 0 to 86400 s, not {text!r}")
    return value


def agent_ask(args: argparse.Namespace) -> AgentAsk | None:
    """The agent workload asked for, or None; one line for agent options without it."""
    workload = getattr(args, "workload", None)
    s, d = getattr(args, "sessions", None), getattr(args, "context", None)
    common = getattr(args, "system_tokens", None)
    if workload != AGENT:
        if s is not None or d is not None or common is not None:
            raise PlanError("--sessions, --context and --system-tokens plan for coding-agent "
                            "sessions: add --workload agent")
        return None
    if d is None:
        raise PlanError("--workload agent needs --context D: the tokens each session keeps "
                        "(e.g. --context 32k)")
    common = common or 0
    if common and common >= d + args.prompt:
        raise PlanError(f"--system-tokens {common} is not below a turn's {d + args.prompt} "
                        "tokens (--context + --prompt): lower it")
    return AgentAsk(s or 1, d, args.prompt, args.gen, getattr(args, "think", 1.0),
                    common_tokens=common)


def free_memory(env: Mapping[str, str]) -> int | None:
    """The host's free memory for KV offloading as TOPOSERVE_HOST_FREE_GIB says, where set;
    None: the topology's own (this machine's MemAvailable, or what a saved topology kept)."""
    raw = env.get("TOPOSERVE_HOST_FREE_GIB", "").strip()
    if raw:
        try:
            value = float(raw)
        except ValueError:
            raise PlanError(f"TOPOSERVE_HOST_FREE_GIB={raw!r}: a number of GiB") from None
        if not 0 <= value < 1e6:
            raise PlanError(f"TOPOSERVE_HOST_FREE_GIB={raw!r}: a number of GiB, 0 or more")
        return int(value * 2**30)
    return None
