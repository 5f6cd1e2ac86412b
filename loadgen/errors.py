"""Errors of loadgen. Each message is one line that tells the user what to do.

    LoadgenError              base; `exit_code` is what the CLI exits with
     ├── BadArgument          a command-line value that cannot work (--prompt 0, --label x)
     ├── TargetError          the server: unreachable, answering errors, lacking what we need
     │    ├── ContextTooShort prompt + gen do not fit the model's context
     │    └── NoTokenize      no usable vLLM-style /tokenize (loadgen counts another way)
     ├── PromptError          chat text could not be brought to the exact token count
     ├── TokenizerError       --tokenizer cannot be loaded or has no chat template
     ├── RunFailed            requests were sent and some or all of them failed
     └── ExportError          an output could not be written (file, Pushgateway, metrics port)

Domain code raises these; only `cli.main` turns them into a message and an exit code.
"""

from __future__ import annotations


class LoadgenError(Exception):
    """Base of every error loadgen reports to the user."""

    exit_code = 1


class BadArgument(LoadgenError):
    """A command-line value that cannot work."""

    exit_code = 2


class TargetError(LoadgenError):
    """The server is unreachable, answers with errors, or lacks something loadgen needs."""


class ContextTooShort(TargetError):
    """--prompt + --gen exceed the model's max_model_len (``max_len``, where the server said it:
    a caller that knows what made the prompt long, --depth, says it in its terms)."""

    def __init__(self, message: str, max_len: int | None = None) -> None:
        super().__init__(message)
        self.max_len = max_len


class NoTokenize(TargetError):
    """The server has no usable vLLM-style /tokenize (loadgen then counts another way).
    ``refusal``: the server's own answer ("HTTP 400: ..."), where it answered one."""

    def __init__(self, message: str, refusal: str | None = None) -> None:
        super().__init__(message)
        self.refusal = refusal


class PromptError(LoadgenError):
    """A chat prompt could not be made exactly --prompt tokens long."""


class RunFailed(LoadgenError):
    """Some or all measured requests failed; results were still reported and written."""


class ExportError(LoadgenError):
    """An output (JSON/CSV/plot file, Pushgateway, metrics port) could not be written."""


class TokenizerError(LoadgenError):
    """--tokenizer could not be loaded or cannot do what the run needs (an argument to fix)."""

    exit_code = 2
