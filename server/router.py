"""Choice of the engine replica for a request: least outstanding, with prefix affinity (pure).

Requests sharing a conversation prefix (same model, same first messages) prefer one replica,
chosen by rendezvous hashing over the replicas that are up, so vLLM's prefix cache there stays
warm; the preference yields to the least-loaded replica when the preferred one has more than
``slack`` requests above it. A replica is taken out when a connection to it fails or its
health check does, and put back when a health check passes.

Replicas may serve different models (two ``--upstream`` of two models): a request naming a
model that a replica lists in its /v1/models goes only to the replicas that list it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

AFFINITY_CHARS = 2048


@dataclass
class Upstream:
    url: str
    up: bool = True
    outstanding: int = 0
    checked: bool = False
    slow_checks: int = 0  # health checks in a row that timed out
    health_path: str = "/health"  # /v1/models for a server without /health (Ollama, gateways)
    models: frozenset[str] | None = None  # the ids its /v1/models lists; None: not read yet


class Router:
    def __init__(self, urls: Sequence[str], slack: int = 4) -> None:
        self.upstreams = [Upstream(u) for u in urls]
        self.slack = slack
        self._turn = 0

    def pick(self, key: bytes | None, exclude: Sequence[Upstream] = (),
             model: str | None = None) -> Upstream | None:
        live = [u for u in self.upstreams if u.up and u not in exclude]
        if model is not None and any(u.models and model in u.models for u in self.upstreams):
            # only the replicas known to serve it (none up: the caller answers 503); a model
            # no replica lists goes anywhere, and the engine answers in its own words
            live = [u for u in live if u.models and model in u.models]
        if not live:
            return None
        least = min(u.outstanding for u in live)
        if key is not None and len(live) > 1:
            preferred = max(live, key=lambda u: _score(key, u.url))
            if preferred.outstanding <= least + self.slack:
                return preferred
        # Rotate among the least loaded so equal replicas share the work.
        self._turn += 1
        tied = [u for u in live if u.outstanding == least]
        return tied[self._turn % len(tied)]

    @property
    def any_up(self) -> bool:
        return any(u.up for u in self.upstreams)

    @property
    def serves_several_models(self) -> bool:
        """Replicas known to list different models: requests are then routed by model."""
        return len({u.models for u in self.upstreams if u.models is not None}) > 1


def _score(key: bytes, url: str) -> bytes:
    return hashlib.blake2b(key + url.encode(), digest_size=8).digest()


def affinity_key(body: dict[str, Any]) -> bytes | None:
    """Bytes identifying a conversation's prefix: the model and the first two messages (the
    system prompt and first user turn of an agent's session) or the head of the prompt."""
    head: object
    if isinstance(body.get("messages"), list):
        head = body["messages"][:2]
    elif isinstance(body.get("prompt"), str | list):
        head = body["prompt"][:AFFINITY_CHARS]
    else:
        return None
    try:
        text = json.dumps([body.get("model"), head], sort_keys=True, default=str)
    except (TypeError, ValueError, RecursionError):
        return None
    return text[:AFFINITY_CHARS].encode("utf-8", "replace")
