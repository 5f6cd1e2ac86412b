"""From a typed request to the engine: the one way plan, serve and tune go (run.py), the
requests the CLI builds (requests.py), and the kernel tables a plan reads (kerneltables.py)."""
