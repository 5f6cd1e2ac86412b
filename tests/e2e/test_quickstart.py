"""The two README commands, and what a user gets from the stack they start."""

from __future__ import annotations

import re
from typing import Any

import openai
import pytest

from tests.conftest import REPO


def readme_quickstart_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return [ln.strip() for ln in section.splitlines() if re.match(r"^    \S", ln)]


def test_the_readme_quick_start_has_exactly_two_commands_that_exist() -> None:
    commands = readme_quickstart_commands()
    assert commands == ["scripts/quickstart.sh", "scripts/test.sh"]
    for cmd in commands:
        script = REPO / cmd
        assert script.is_file()
        assert script.stat().st_mode & 0o111, f"{cmd} is not executable"


def test_ci_runs_exactly_the_readme_test_command() -> None:
    lines = [ln for ln in (REPO / ".ci" / "run").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    assert lines == ["exec bash scripts/test.sh"]


@pytest.mark.stack
def test_completions_through_the_proxy_return_exactly_the_tokens_asked(stack: Any) -> None:
    client = openai.OpenAI(base_url=f"{stack.proxy_url}/v1", api_key="unused")
    out = client.completions.create(
        model=stack.model, prompt=list(range(10, 42)), max_tokens=24,
        extra_body={"min_tokens": 24, "ignore_eos": True})
    assert out.usage is not None
    assert out.usage.prompt_tokens == 32
    assert out.usage.completion_tokens == 24


@pytest.mark.stack
def test_streamed_chat_through_the_proxy_reaches_the_end(stack: Any) -> None:
    client = openai.OpenAI(base_url=f"{stack.proxy_url}/v1", api_key="unused")
    stream = client.chat.completions.create(
        model=stack.model, messages=[{"role": "user", "content": "def fib(n):"}],
        max_tokens=16, stream=True, stream_options={"include_usage": True},
        extra_body={"min_tokens": 16, "ignore_eos": True})
    chunks = list(stream)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finish[-1] == "length"
    usage = chunks[-1].usage
    assert usage is not None
    assert usage.completion_tokens == 16
