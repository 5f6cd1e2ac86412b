"""A model folder whose name is not UTF-8 is refused in one line, before any command is printed.

vLLM cannot load a model from such a folder: Python hands it the path with the byte as a
surrogate escape, and the Rust tokenizer that transformers loads takes paths as UTF-8 text
(vLLM 0.32 on the CPU: ``UnicodeEncodeError: 'utf-8' codec can't encode character '\\udcff'``
at start, after loading the config). The folder's name would also become the served model name,
which no client can send back in a UTF-8 JSON request. So the command the launcher would print
could not run, however it was quoted; the user is told to rename the folder instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, free_port, processes_serving

MODEL = REPO / "tests" / "fixtures" / "models" / "llama-3.2-3b"
CPU_ONLY = REPO / "tests" / "fixtures" / "golden" / "cpu-only.toposerve.json"


def model_named(tmp_path: Path, name: bytes) -> bytes:
    """A real copy of the fixture model in a folder named with these bytes."""
    path = os.fsencode(tmp_path) + b"/" + name
    try:
        shutil.copytree(os.fsencode(MODEL), path)
    except OSError as exc:  # a file system that keeps names as UTF-8 only
        pytest.skip(f"this file system refuses a non-UTF-8 name: {exc}")
    return path


def launcher(*argv: str | bytes) -> subprocess.CompletedProcess[str]:
    # the model path goes in as bytes, as a shell passes a name it globbed or was typed
    return subprocess.run([sys.executable, "-m", "launcher", *argv], cwd=REPO,
                          capture_output=True, text=True, errors="backslashreplace",
                          timeout=120)


def assert_refused(res: subprocess.CompletedProcess[str], shown: str) -> None:
    assert res.returncode == 1, res.stdout + res.stderr
    assert res.stdout == ""  # no plan, no command that cannot run
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("launcher: error: ")
    assert shown in lines[0]  # the byte as the user can read it
    assert "not UTF-8" in lines[0]
    assert "rename" in lines[0]
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("command", [["plan"], ["plan", "--json"], ["serve", "--dry-run"]],
                         ids=["plan", "plan-json", "serve-dry-run"])
def test_a_model_folder_named_with_a_non_utf8_byte_is_refused_with_rename_it(
        tmp_path: Path, command: list[str]) -> None:
    path = model_named(tmp_path, b"m\xff")
    res = launcher(*command, "--model", path, "--topology", str(CPU_ONLY),
                   "--port", str(free_port()))
    assert_refused(res, f"{tmp_path}/m\\xff")


def test_a_utf8_link_to_such_a_folder_is_refused_too(tmp_path: Path) -> None:
    # the launcher hands vLLM the folder the link resolves to, whose name is the one vLLM reads
    path = model_named(tmp_path, b"m\xff")
    link = tmp_path / "model"
    os.symlink(path, os.fsencode(link))
    res = launcher("plan", "--model", str(link), "--topology", str(CPU_ONLY))
    assert_refused(res, f"{tmp_path}/m\\xff")


def test_a_model_folder_named_in_utf8_beyond_ascii_is_planned(tmp_path: Path) -> None:
    path = model_named(tmp_path, "modèle-ü".encode())
    res = launcher("plan", "--model", path, "--topology", str(CPU_ONLY))
    assert res.returncode == 0, res.stderr
    assert f"vllm serve '{tmp_path}/modèle-ü' " in res.stdout


def test_serve_with_a_saved_plan_refuses_such_a_folder_and_starts_nothing(
        tmp_path: Path) -> None:
    # the plan was made while the folder had a UTF-8 name, then the folder was renamed: `serve
    # --plan` resolves --model through the same check as planning (run.resolve_model; the plan
    # file's own copy of the path is never what serve starts), so it stops there, before any
    # engine or proxy is started
    planned = model_named(tmp_path, b"m")
    saved = tmp_path / "plan.json"
    res = launcher("plan", "--json", "--model", planned, "--topology", str(CPU_ONLY))
    assert res.returncode == 0, res.stderr
    saved.write_text(res.stdout)
    path = os.fsencode(tmp_path) + b"/m\xff"
    try:
        os.rename(planned, path)
    except OSError as exc:  # a file system that keeps names as UTF-8 only
        pytest.skip(f"this file system refuses a non-UTF-8 name: {exc}")
    proxy, engine = free_port(), free_port()
    res = launcher("serve", "--plan", str(saved), "--model", path, "--topology", str(CPU_ONLY),
                   "--port", str(proxy), "--engine-port", str(engine),
                   "--log-dir", str(tmp_path / "logs"))
    assert_refused(res, f"{tmp_path}/m\\xff")
    assert processes_serving(proxy, engine) == []
