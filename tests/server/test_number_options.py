"""The proxy's seconds options (--upstream-keep-alive and the timeouts) on generated values:
each either becomes exactly the number given, finite and above 0, or is refused in one line."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from server.config import _SECONDS, ConfigError, config_from_args

UPSTREAM = ["--upstream", "http://127.0.0.1:8000"]


@given(st.sampled_from(_SECONDS),
       st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr),
                 st.text(max_size=12)))
def test_a_seconds_option_is_the_positive_number_given_or_one_line(name: str,
                                                                   text: str) -> None:
    flag = "--" + name.replace("_", "-")
    refused: BaseException | None = None
    try:
        config = config_from_args([*UPSTREAM, f"{flag}={text}"], env={})
    except (ConfigError, SystemExit) as exc:
        refused = exc
    if isinstance(refused, SystemExit):  # argparse: not a number at all (usage + one error line)
        assert refused.code == 2
    elif refused is not None:
        assert "\n" not in str(refused)
        assert flag in str(refused)
    else:
        value = float(text)
        assert math.isfinite(value)
        assert value > 0
        got = [v for k, v in vars(config).items() if k.startswith(name)]
        assert got == [pytest.approx(value)], (name, vars(config))
