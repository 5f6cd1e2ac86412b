"""`launcher tune`'s measurements outlive a plan file it cannot write.

The plan is written once, after every candidate has been measured (minutes to hours): a folder
removed meanwhile, or a disk that filled up, must not take those measurements with it. Every
start here is real (the proxy and the stand-in engine of tests/serve/standin_engine.py, through
TOPOSERVE_ENGINE_CMD); only loadgen's scores are scripted.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from launcher.cli import cmd_tune
from launcher.cli.main import main
from launcher.engine.launchspec import LaunchSpec
from launcher.engine.supervise import free_port

STANDIN = Path(__file__).with_name("standin_engine.py")
SCORES = {"default": 100.0, "small-prefill-chunks": 140.0}


def scripted_loadgen(after_last_round: Any) -> Any:
    """loadgen's JSON for each round, the candidate's score in it; ``after_last_round`` runs
    once the last candidate's last round is written (what happens to the disk meanwhile)."""
    def run(spec: LaunchSpec, args: argparse.Namespace, out: Path,
            warmup: int = 0) -> tuple[int, str]:
        name = out.name.split("-start")[0]
        rows = [{"ttft_s": 0.1, "e2e_s": 0.4, "completion_tokens": args.gen, "error": None}
                for _ in range(args.requests)]
        summary = {"requests_ok": args.requests, "requests_failed": 0,
                   "output_tok_s": SCORES[name], "duration_s": 1.0}
        out.write_text(json.dumps({"summary": summary, "requests": rows}))
        if name == "small-prefill-chunks" and out.name.endswith(f"round{args.repeats}.json"):
            after_last_round()
        return 0, ""

    return run


def tune(tmp_path: Path, out: Path) -> list[str]:
    return ["tune", "--port", str(free_port()), "--prompt", "16", "--gen", "8",
            "--concurrency", "2", "--requests", "4", "--repeats", "2", "--warmup", "0",
            "--reruns", "0", "--objective", "throughput", "--out", str(out),
            "--results-dir", str(tmp_path / "results"), "--log-dir", str(tmp_path / "logs"),
            "--ready-timeout", "120"]


def printed_document(stdout: str) -> dict[str, Any]:
    """The JSON document tune printed after its table (the plan it could not write)."""
    start = stdout.index("\n{\n") + 1
    data, _ = json.JSONDecoder().raw_decode(stdout[start:])
    assert isinstance(data, dict)
    return data


@pytest.fixture
def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOPOSERVE_ENGINE_CMD", f"{sys.executable} {STANDIN}")
    monkeypatch.setenv("STANDIN_STATE", str(tmp_path / "state"))


def assert_measurements_survive(tmp_path: Path, stdout: str, err: str, out: Path,
                                reason: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err + stdout
    assert lines[0].startswith(f"launcher: error: --out {out}: cannot write the plan ({reason})")
    assert "launcher serve --plan" in lines[0]
    assert str(tmp_path / "results") in lines[0]
    doc = printed_document(stdout)
    tuned = doc["tuned"]
    assert tuned["winner"] == "small-prefill-chunks"
    assert {r["candidate"]: r["scores"] for r in tuned["results"]} == {
        name: [score, score] for name, score in SCORES.items()}
    assert doc["vllm_extra_args"] == ["--max-num-batched-tokens", "256"]  # the winner's plan
    # and every round's loadgen JSON is where the error says
    assert len(list((tmp_path / "results").glob("*-start1-round*.json"))) == 4


def test_a_plan_folder_removed_during_the_tune_leaves_the_measurements_and_a_one_line_error(
    tmp_path: Path, standin: None, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    folder = tmp_path / "plans"
    folder.mkdir()
    out = folder / "plan.json"
    monkeypatch.setattr(cmd_tune, "run_loadgen",
                        scripted_loadgen(lambda: shutil.rmtree(folder)))
    assert main(tune(tmp_path, out)) == 1
    said = capsys.readouterr()
    assert_measurements_survive(tmp_path, said.out, said.err, out, "No such file or directory")


def test_a_full_disk_at_the_final_write_leaves_the_measurements_and_the_old_plan(
    tmp_path: Path, standin: None, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "plan.json"
    out.write_text('{"an": "earlier plan"}\n')
    written: list[int] = []

    def disk_fills(fd: int, data: bytes) -> int:
        # the disk fills half-way through the plan: part of it written, then ENOSPC (files
        # elsewhere, the engines' logs, are written as ever)
        if Path(os.readlink(f"/proc/self/fd/{fd}")).parent != tmp_path:
            return real_write(fd, data)
        if written:
            raise OSError(errno.ENOSPC, "No space left on device")
        written.append(fd)
        return real_write(fd, data[: len(data) // 2])

    real_write = cmd_tune.os.write
    monkeypatch.setattr(cmd_tune, "run_loadgen", scripted_loadgen(
        lambda: monkeypatch.setattr(cmd_tune.os, "write", disk_fills)))
    assert main(tune(tmp_path, out)) == 1
    said = capsys.readouterr()
    assert_measurements_survive(tmp_path, said.out, said.err, out, "No space left on device")
    # a plan either written whole or not at all: the earlier one is still there, no half file
    assert out.read_text() == '{"an": "earlier plan"}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logs", "plan.json", "results",
                                                          "state"]
