"""Flags and variables `serve` adds to the engine command beyond the plan's layout. Pure.

Each flag is optional: it is given where the installed vLLM takes it and otherwise left out with
a note (vllmflags.py), never a refused start.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from launcher.engine.vllmflags import OptionalFlag

# vLLM's --allowed-media-domains is an exact host list, and an empty list means any host: remote
# media off is one name that can never resolve (RFC 6761 reserves .invalid).
NO_REMOTE_MEDIA = "remote-media-off.invalid"


@dataclass(frozen=True)
class EngineExtras:
    flags: tuple[OptionalFlag, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    known: frozenset[str] | None = None  # the installed vLLM's engine flags; None: unknown

    def __add__(self, other: EngineExtras) -> EngineExtras:
        return EngineExtras((*self.flags, *other.flags), {**self.env, **other.env},
                            self.known if self.known is not None else other.known)


def media_protection(domains: Sequence[str], *, allow_internal: bool) -> EngineExtras:
    """What keeps vLLM from fetching media inside this machine's network when the proxy's own
    check (server/guard.py) cannot see it: a public name that resolves inside, or a public URL
    that redirects there. ``domains``: the hosts media may come from (none: no remote media;
    images in ``data:`` URLs still work). With ``allow_internal`` vLLM's defaults stand."""
    if allow_internal:
        return EngineExtras()
    hosts = tuple(domains) or (NO_REMOTE_MEDIA,)
    why = ("media URLs are fetched from any host" if not domains else
           f"media URLs are not limited to {', '.join(domains)}")
    return EngineExtras(
        flags=(OptionalFlag(("--allowed-media-domains", *hosts), why),),
        # vLLM follows redirects unless told not to: a public URL could lead it back inside.
        env={"VLLM_MEDIA_URL_ALLOW_REDIRECTS": "0"},
    )
