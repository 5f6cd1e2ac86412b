"""python -m simengine: run a simulated engine (see simengine.engine)."""

from simengine.engine import main

main()
