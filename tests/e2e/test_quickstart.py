"""The two README commands, and what a user gets from the stack they start."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any

import openai
import pytest

from launcher.pipeline import enginesteps
from launcher.probe import enginestep
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


FIRST = re.compile(
    r"timed this machine's CPU engine once \((\d+) s, kept for later plans\): predicted prefill "
    r"([\d,]+) tok/s, decode ([\d,.]+) tok/s \(the assumed plan said ([\d,]+)/([\d,.]+)\)")
PLANNED = re.compile(r"prefill (\d+) tok/s, decode ([\d.]+) tok/s")


def figures(*said: str) -> tuple[float, ...]:
    return tuple(float(s.replace(",", "")) for s in said)


@pytest.mark.stack
def test_the_first_serve_times_the_cpu_engine_before_the_proxy_and_a_later_plan_uses_it(
        stack: Any) -> None:
    """The stack is the README's serve on a machine where nothing was timed: it times its engine
    once it is up, before the proxy's banner, keeps the record for this machine, and prints the
    plan made from it beside the assumed one; a later plan here is made from that record."""
    if stack.cache is None:
        pytest.skip("an engine reused from TOPOSERVE_TEST_VLLM_URL: no serve of the stack's own")
    log = stack.log_path.read_text()
    said = FIRST.search(log)
    assert said, log[-3000:]
    assert said.start() < log.index("toposerve is ready"), "timed after the proxy took requests"
    first = PLANNED.search(log)  # the plan printed before the engine started: the assumed one
    assert first, log[-3000:]
    assert figures(said[4], said[5]) == figures(first[1], first[2])
    env = {**os.environ, "TOPOSERVE_CACHE": str(stack.cache)}
    assert enginestep.load(stack.cache, enginesteps.key_here(env)) is not None
    again = subprocess.run([sys.executable, "-m", "launcher", "serve", "--dry-run"], cwd=REPO,
                           env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert "served decode step timed on this machine" in again.stdout, again.stdout
    assert "timing this machine's CPU engine" not in again.stdout
    later = PLANNED.search(again.stdout)
    assert later, again.stdout
    assert figures(later[1], later[2]) == figures(said[2], said[3])
