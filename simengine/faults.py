"""Fault specifications for the simulated engine (pure parsing, no I/O).

A spec is a comma-separated list, given per request in the ``X-Sim-Fault`` header, for every
request with ``--fault``, or at run time through ``POST /sim/control``:

    kill-after=N      close the connection abruptly (TCP reset) once N tokens were sent
    stall-after=N     stop sending after N tokens and keep the connection open, silent
    garbage           answer 200 with a body that is neither valid SSE nor JSON
    garbage-after=N   N good tokens, then a malformed ``data:`` line and the end of the body
    end-after=N       N good tokens, then a clean end of the body without the stream's closing
                      events ([DONE], message_stop, response.completed): a truncated answer
    status=CODE       answer CODE at once with an OpenAI-format error body (e.g. 503)
    retry-after=S     with status=: add a ``Retry-After: S`` header
    header-delay=S    wait S seconds before sending the response headers
    close             read the request, then close the connection without any response
"""

from __future__ import annotations

from dataclasses import dataclass


class FaultSpecError(ValueError):
    """A fault spec could not be parsed; the message names the bad item."""


@dataclass(frozen=True)
class Fault:
    kill_after: int | None = None
    stall_after: int | None = None
    garbage_after: int | None = None
    end_after: int | None = None
    status: int | None = None
    retry_after: int | None = None
    header_delay: float = 0.0
    close: bool = False

    @property
    def active(self) -> bool:
        return self != NO_FAULT


NO_FAULT = Fault()

_INT_KEYS = {
    "kill-after": "kill_after",
    "stall-after": "stall_after",
    "garbage-after": "garbage_after",
    "end-after": "end_after",
    "status": "status",
    "retry-after": "retry_after",
}


def parse_fault(spec: str) -> Fault:
    """Parse ``"kill-after=3,status=503"`` into a Fault; an empty spec is no fault."""
    fields: dict[str, object] = {}
    for raw in spec.split(","):
        item = raw.strip()
        if not item:
            continue
        key, _, value = item.partition("=")
        key = key.strip().lower()
        value = value.strip()
        if key == "garbage" and not value:
            fields["garbage_after"] = 0
        elif key == "close" and not value:
            fields["close"] = True
        elif key == "header-delay":
            fields["header_delay"] = _number(key, value, float)
        elif key in _INT_KEYS:
            fields[_INT_KEYS[key]] = _number(key, value, int)
        else:
            raise FaultSpecError(
                f"unknown fault {item!r}: use kill-after=N, stall-after=N, garbage, "
                "garbage-after=N, end-after=N, status=CODE, retry-after=S, header-delay=S "
                "or close"
            )
    return Fault(**fields)  # type: ignore[arg-type]


def _number(key: str, value: str, kind: type[int] | type[float]) -> int | float:
    try:
        number = kind(value)
    except ValueError:
        raise FaultSpecError(f"fault {key} needs a number, got {value!r}") from None
    if number < 0:
        raise FaultSpecError(f"fault {key} must not be negative, got {value!r}")
    return number
