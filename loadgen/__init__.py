"""loadgen: prefill against token generation, measured exactly over an OpenAI-compatible API.

from loadgen import Config, run
report = run(Config(url="http://127.0.0.1:8000", prompt=512, gen=256, concurrency=4))
"""

from loadgen.api import Hooks, run
from loadgen.config import Config
from loadgen.errors import LoadgenError
from loadgen.outputs.results import LevelResult, Report

__all__ = ["Config", "Hooks", "LevelResult", "LoadgenError", "Report", "run"]
