"""A simulated OpenAI/vLLM engine with exact timings and faults, for tests and benchmarks.

Its own package so that the proxy (``server/``) ships without it: the proxy images copy only
launcher/, server/ and loadgen/. ``python -m simengine`` runs one; ``simengine.engine.spawn``
runs one in a child process; ``simengine.client`` is a lean streaming client for benchmarks.
"""
