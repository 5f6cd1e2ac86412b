"""`loadgen --tokenizer org/name`: the embedded model's tokenizer fetched by transformers from a
stand-in hub on loopback (HF_ENDPOINT at it, HF_HOME in a temporary folder), as a user on a fresh
machine meets it: it counts exactly as the local tokenizer does, loads again offline from the
cache, a missing or gated repository ends in one line, and a run against a server without
/tokenize gets exactly the prompt lengths asked.

Hub ids are loaded in their own processes, as a user runs loadgen: huggingface_hub reads
HF_ENDPOINT once, at its import.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# imported before any test sets HF_*: what it read then must not matter
from huggingface_hub import constants as hub_constants

from loadgen.tokens import load_tokenizer
from tests.launcher.standin_hub import Repo, StandinHub, commit_of
from tests.loadgen.conftest import REPO, run_cli
from tests.loadgen.standin import spawn

REPO_ID = "org/name"
GATED = "gated-org/licensed"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "config.json")
TEXTS = ["", "def f(x):\n    return x + 1\n", "import os, sys  # a comment", " the" * 50]
MESSAGES = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Fix the bug in parse_args()."},
]
GEN = 8

# Counts one process makes with loadgen's loader, as JSON on stdout (a one-line error on failure).
COUNT = """
import json, sys
from loadgen.errors import TokenizerError
from loadgen.tokens import load_tokenizer
try:
    tok = load_tokenizer(sys.argv[1])
except TokenizerError as exc:
    print(exc, file=sys.stderr)
    raise SystemExit(2)
texts = json.loads(sys.argv[2])
print(json.dumps({"text": [tok.text(t) for t in texts], "output": [tok.output(t) for t in texts],
                  "chat": tok.chat(json.loads(sys.argv[3]))}))
"""


def _standin(tiny_model_path: str) -> StandinHub:
    main = commit_of("main")
    files = {name: (Path(tiny_model_path) / name).read_bytes() for name in TOKENIZER_FILES}
    return StandinHub(
        {
            REPO_ID: Repo(commits={main: files}, refs={"main": main}),
            GATED: Repo(commits={main: files}, refs={"main": main}, gated=True),
        }
    ).start()


def _fresh_machine(hub: StandinHub, hf_home: Path) -> dict[str, str]:
    """A fresh machine: the hub's address, an empty HF_HOME, no token, online."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    base.pop("TRANSFORMERS_OFFLINE", None)
    return {**base, "HF_ENDPOINT": hub.url, "HF_HOME": str(hf_home)}


@pytest.fixture
def hub(tiny_model_path: str) -> Iterator[StandinHub]:
    standin = _standin(tiny_model_path)
    yield standin
    standin.stop()


@pytest.fixture
def env(hub: StandinHub, tmp_path: Path) -> dict[str, str]:
    return _fresh_machine(hub, tmp_path / "hf")


@dataclass(frozen=True)
class Fetched:
    """A fresh machine's first load of REPO_ID in its own process: what it counted, what it asked
    the hub, and the HF_HOME it left. Made once for the module: each load in a process of its
    own imports transformers (~2 s), and three tests start from this same first load."""

    hub: StandinHub
    env: dict[str, str]
    counts: dict[str, Any]
    asked: list[str]  # the paths the first load asked the hub for, in order


@pytest.fixture(scope="module")
def fetched(tiny_model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fetched]:
    standin = _standin(tiny_model_path)
    try:
        env = _fresh_machine(standin, tmp_path_factory.mktemp("fetched") / "hf")
        counts = _counts(REPO_ID, env)
        yield Fetched(standin, env, counts, standin.paths())
    finally:
        standin.stop()


@pytest.fixture(scope="module")
def plain(tiny_model_path: str) -> Iterator[str]:
    """An OpenAI-compatible server without /tokenize, counting with the embedded tokenizer."""
    with spawn("--tokenizer", tiny_model_path, "--ttft", "0.01", "--itl", "0.002") as url:
        yield url


def _counts_in_process(name: str) -> dict[str, Any]:
    tok = load_tokenizer(name)
    return {
        "text": [tok.text(t) for t in TEXTS],
        "output": [tok.output(t) for t in TEXTS],
        "chat": tok.chat(MESSAGES),
    }


def _count(name: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", COUNT, name, json.dumps(TEXTS), json.dumps(MESSAGES)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        check=False,
        env=env,
    )


def _counts(name: str, env: dict[str, str]) -> dict[str, Any]:
    result = _count(name, env)
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def test_a_hub_id_loads_through_hf_endpoint_and_counts_as_the_local_tokenizer(
    fetched: Fetched, tiny_model_path: str
) -> None:
    local = _counts_in_process(tiny_model_path)
    assert local["text"][1] > 1  # real counts, not zeros
    assert local["chat"] > local["text"][1]
    assert fetched.counts == local
    # what the fetch asked: the revision's tree listing, then the files, from the stand-in
    paths = fetched.asked
    assert any(p.startswith(f"/api/models/{REPO_ID}/tree/") for p in paths)
    resolved = [p for p in paths if p.startswith(f"/{REPO_ID}/resolve/")]
    assert any(p.endswith("/tokenizer.json") for p in resolved)
    hf_hub = Path(fetched.env["HF_HOME"]) / "hub"
    assert list(hf_hub.glob("models--org--name/snapshots/*/tokenizer.json"))


def test_once_fetched_it_loads_offline_from_the_cache_without_asking_the_hub(
    fetched: Fetched, tiny_model_path: str
) -> None:
    asked = len(fetched.hub.seen)
    offline = _counts(REPO_ID, {**fetched.env, "HF_HUB_OFFLINE": "1"})
    assert offline == fetched.counts == _counts_in_process(tiny_model_path)
    assert len(fetched.hub.seen) == asked  # not one request


def test_offline_in_process_reads_hf_home_and_hf_hub_offline_when_loading(
    fetched: Fetched, tiny_model_path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # huggingface_hub was imported above, before HF_HOME pointed here: the loader must read the
    # environment as it is when it loads, as the planner's launcher.model.hub does. Here: a
    # copy of the cache the first load left (its snapshots link into blobs/ relatively).
    shutil.copytree(fetched.env["HF_HOME"], tmp_path / "hf", symlinks=True)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    was_offline = hub_constants.HF_HUB_OFFLINE
    assert _counts_in_process(REPO_ID) == _counts_in_process(tiny_model_path)
    assert was_offline == hub_constants.HF_HUB_OFFLINE  # put back as it was


@pytest.mark.parametrize(
    ("repo_id", "says"),
    [("org/missing", "not a valid model identifier"), (GATED, "gated repo")],
)
def test_a_missing_or_gated_repo_is_one_line_from_the_loader(
    env: dict[str, str], repo_id: str, says: str
) -> None:
    result = _count(repo_id, env)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"cannot load tokenizer {repo_id!r} (")
    assert says.lower() in lines[0].lower()


@pytest.mark.parametrize("repo_id", ["org/missing", GATED])
def test_the_cli_given_a_missing_or_gated_repo_exits_2_with_one_line(
    plain: str, env: dict[str, str], tmp_path: Path, repo_id: str
) -> None:
    out = tmp_path / "r.json"
    result = run_cli(
        "--url", plain, "--prompt", "64", "--gen", "4", "--requests", "1",
        "--tokenizer", repo_id, "--json", str(out), "--no-progress", env=env,
    )  # fmt: skip
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"cannot load tokenizer {repo_id!r}" in lines[0]
    assert not out.exists()  # nothing measured


@pytest.mark.parametrize("chat", [False, True])
def test_a_run_without_tokenize_gets_exact_prompts_from_the_hub_tokenizer(
    plain: str, env: dict[str, str], tmp_path: Path, chat: bool
) -> None:
    out = tmp_path / "r.json"
    result = run_cli(
        "--url", plain, "--prompt", "300", "--gen", str(GEN), "--requests", "4",
        "--concurrency", "2", "--tokenizer", REPO_ID, "--json", str(out), "--no-progress",
        *(["--chat"] if chat else []), env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    # the server's own usage.prompt_tokens, from the same tokenizer the stand-in counts with
    rows = [(r["prompt_tokens"], r["completion_tokens"], r["error"]) for r in data["requests"]]
    assert rows == [(300, GEN, None)] * 4
    assert data["prompts"]["source"] == "tokenizer"
    assert data["prompts"]["tokenizer"] == REPO_ID
    assert data["prompts"]["exact"] == data["prompts"]["checked"] == 4
