"""toposerve's OpenAI-compatible proxy in front of vLLM.

The proxy's API is ``server.app.create_app(config)``, ``server.serve.run(config)`` and
``server.config.ProxyConfig``, each imported from its module: this package imports nothing, so
that no module of it depends on another through ``__init__`` (no import cycle: leaf modules
such as ``server.config`` stay light, and ``from server import anthropic`` loads that module
alone).
"""
