"""loadgen's numeric options (--prompt, --gen, --rate, --sweep, --depth, --context, ...), fed
generated values, up to three at a time, in both workloads: each run configures with sane values
(no negative count, no NaN or infinite time) or is one BadArgument line; never a traceback."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.cli import build_parser, config_from
from loadgen.config import Config
from loadgen.errors import BadArgument

VALUES = st.one_of(
    st.sampled_from(["0", "-1", "1", "7", "nan", "inf", "-inf", "1e308", "1e-9", "2.5", "",
                     "99999999999", "1k", "2K", "1,2", "3:1", "0x10", "²"]),
    st.text(max_size=5),
)
OPTIONS = st.sampled_from([
    "--prompt", "--gen", "--concurrency", "--rate", "--requests", "--duration", "--warmup",
    "--sweep", "--processes", "--repetitions", "--timeout", "--shared-prefix", "--gpu-sample",
    "--metrics-linger", "--sessions", "--turns", "--think", "--slo-ttft-ms", "--slo-tpot-ms",
    "--slo-share", "--soak-tokens", "--turn-tokens", "--context", "--depth", "--system-tokens",
    "--first-prompt",
])  # fmt: skip
TIMES = ("rate", "duration", "timeout_s", "think_s", "metrics_linger", "gpu_sample_s",
         "slo_ttft_ms", "slo_tpot_ms", "slo_share")
COUNTS = ("prompt", "gen", "concurrency", "requests", "warmup", "processes", "repetitions",
          "sessions", "turns", "shared_prefix", "turn_tokens", "soak_tokens")


@settings(max_examples=250, deadline=None)
@given(st.lists(st.tuples(OPTIONS, VALUES), max_size=3),
       st.sampled_from([(), ("--workload", "agent")]))
def test_any_numeric_option_values_configure_sanely_or_are_one_line(
        pairs: list[tuple[str, str]], workload: tuple[str, ...]) -> None:
    argv = [*workload, *(f"{option}={value}" for option, value in pairs)]
    config: Config | None = None
    message = ""
    try:
        config = config_from(build_parser().parse_args(argv))
    except BadArgument as exc:
        message = str(exc)
    if config is None:
        assert message
        assert "\n" not in message
        return
    for name in TIMES:
        value = getattr(config, name)
        assert value is None or (math.isfinite(value) and value >= 0), (name, value)
    for name in COUNTS:
        value = getattr(config, name)
        assert value is None or value >= 0, (name, value)
