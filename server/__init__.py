"""toposerve's OpenAI-compatible proxy in front of vLLM.

The proxy's public API is ``create_app(config)``, ``run(config)`` and ``ProxyConfig``; they are
loaded on first use so that importing a leaf module (``server.config``) stays light.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ProxyConfig", "create_app", "run"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from server.app import create_app

        return create_app
    if name == "run":
        from server.serve import run

        return run
    if name == "ProxyConfig":
        from server.config import ProxyConfig

        return ProxyConfig
    raise AttributeError(name)
