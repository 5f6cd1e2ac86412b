"""From a typed request to the engine: the one way plan, serve and tune go (run.py), the
requests the CLI builds (requests.py), and what a plan reads that was measured on this machine
(kerneltables.py: the model's kernel tables; enginesteps.py: the CPU engine's step)."""
