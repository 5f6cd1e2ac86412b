"""`launcher serve --plan FILE` serves the model the plan was made for.

A plan file (`launcher plan --json`, `launcher tune`) records that model (model_ref: the folder
vLLM was given, a hub id, or the embedded model; its revision, served name and config.json
digest). Without --model, serve serves it; a --model naming another model is refused in one
line before anything starts (a note under --dry-run); a copy of the folder elsewhere (a node of a
group keeps its own) is the same model. A plan file of an earlier release, which records only the
model's name, still serves the embedded model it was made for, and asks for --model otherwise.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher.cli.main import main
from tests.conftest import REPO, TOPOLOGIES, free_port, processes_serving

MODELS = REPO / "tests" / "fixtures" / "models"
LLAMA3B, LLAMA8B = MODELS / "llama-3.2-3b", MODELS / "llama-3.1-8b"
CPU_ONLY = REPO / "tests" / "fixtures" / "golden" / "cpu-only.toposerve.json"
H200 = TOPOLOGIES / "h200x2-nvlink.nvml.json"
LLAMA70B = MODELS / "llama-3.3-70b"


def launcher(*argv: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "launcher", *argv], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def saved_plan(tmp_path: Path, *argv: str) -> Path:
    res = launcher("plan", "--json", *argv)
    assert res.returncode == 0, res.stderr
    path = tmp_path / "plan.json"
    path.write_text(res.stdout)
    return path


def engine_line(stdout: str) -> str:
    return next(ln for ln in stdout.splitlines() if ln.strip().startswith("engine:"))


def one_line_error(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode != 0, res.stdout
    assert "Traceback" not in res.stderr
    (line,) = res.stderr.splitlines()
    assert line.startswith("launcher: error: ")
    return line


def test_a_saved_plan_serves_its_own_model_without_model(tmp_path: Path) -> None:
    # the defect: this served the embedded tiny model under the 3B's plan (--max-model-len 8960)
    path = saved_plan(tmp_path, "--model", str(LLAMA3B), "--topology", str(CPU_ONLY))
    res = launcher("serve", "--plan", str(path), "--topology", str(CPU_ONLY), "--dry-run",
                   "--port", str(free_port()))
    assert res.returncode == 0, res.stderr
    engine = engine_line(res.stdout)
    assert f"vllm serve {LLAMA3B} " in engine
    assert "--served-model-name llama-3.2-3b " in engine
    assert "tiny" not in res.stdout
    assert "note:" not in res.stdout


def test_the_plans_served_name_is_kept_unless_another_is_given(tmp_path: Path) -> None:
    path = saved_plan(tmp_path, "--model", str(LLAMA3B), "--topology", str(CPU_ONLY),
                      "--served-model-name", "coder")
    res = launcher("serve", "--plan", str(path), "--topology", str(CPU_ONLY), "--dry-run")
    assert "--served-model-name coder " in engine_line(res.stdout), res.stderr
    res = launcher("serve", "--plan", str(path), "--topology", str(CPU_ONLY), "--dry-run",
                   "--served-model-name", "mine")
    assert "--served-model-name mine " in engine_line(res.stdout), res.stderr


def test_the_same_folder_by_another_path_or_link_is_the_plans_model(tmp_path: Path) -> None:
    path = saved_plan(tmp_path, "--model", str(LLAMA3B), "--topology", str(CPU_ONLY))
    link = tmp_path / "link"
    link.symlink_to(LLAMA3B)
    for model, cwd in (("./models/../models/llama-3.2-3b", MODELS.parent), (str(link), REPO)):
        res = launcher("serve", "--plan", str(path), "--topology", str(CPU_ONLY), "--dry-run",
                       "--model", model, cwd=cwd)
        assert res.returncode == 0, res.stderr
        assert f"vllm serve {LLAMA3B} " in engine_line(res.stdout)
        assert "note:" not in res.stdout


def test_a_copy_of_the_folder_elsewhere_is_the_plans_model_and_an_edited_copy_is_not(
        tmp_path: Path) -> None:
    # a node of a group may keep its copy of the model at another path than the head's
    path = saved_plan(tmp_path, "--model", str(LLAMA3B), "--topology", str(CPU_ONLY))
    copy = tmp_path / "node1" / "llama-3.2-3b"
    shutil.copytree(LLAMA3B, copy)
    res = launcher("serve", "--plan", str(path), "--topology", str(CPU_ONLY), "--dry-run",
                   "--model", str(copy))
    assert res.returncode == 0, res.stderr
    assert f"vllm serve {copy} " in engine_line(res.stdout)
    cfg = json.loads((copy / "config.json").read_text())
    cfg["num_hidden_layers"] += 1  # another model under the same folder name
    (copy / "config.json").write_text(json.dumps(cfg))
    proxy, engine = free_port(), free_port()
    line = one_line_error(launcher("serve", "--plan", str(path), "--topology", str(CPU_ONLY),
                                   "--model", str(copy), "--port", str(proxy),
                                   "--engine-port", str(engine)))
    assert f"was made for {LLAMA3B}, not --model {copy}" in line
    assert processes_serving(proxy, engine) == []


@pytest.mark.parametrize("nodes", [False, True], ids=["one-machine", "node-of-a-group"])
def test_a_mismatching_model_is_refused_in_one_line_and_nothing_listens(
        tmp_path: Path, nodes: bool) -> None:
    group = ("--nodes", "2", "--network-gbps", "25", "--master-addr", "127.0.0.1") if nodes else ()
    topo, planned = (H200, LLAMA70B) if nodes else (CPU_ONLY, LLAMA3B)
    path = saved_plan(tmp_path, "--model", str(planned), "--topology", str(topo), *group)
    proxy, engine = free_port(), free_port()
    rank = ("--node-rank", "1") if nodes else ()
    res = launcher("serve", "--plan", str(path), "--topology", str(topo), *group, *rank,
                   "--model", str(LLAMA8B), "--port", str(proxy), "--engine-port", str(engine),
                   "--log-dir", str(tmp_path / "logs"))
    line = one_line_error(res)
    assert res.stdout == ""  # no plan printed, nothing started
    assert f"was made for {planned}, not --model {LLAMA8B}" in line
    assert f"launcher plan --model {LLAMA8B} --json > {path}" in line
    assert "drop --model" in line
    assert processes_serving(proxy, engine) == []
    # the node serves the plan's own model when --model is left out
    res = launcher("serve", "--plan", str(path), "--topology", str(topo), *group, *rank,
                   "--dry-run")
    assert res.returncode == 0, res.stderr
    assert f"vllm serve {planned} " in engine_line(res.stdout)


def test_dry_run_shows_the_mismatch_as_a_note_instead_of_refusing(tmp_path: Path) -> None:
    path = saved_plan(tmp_path, "--model", str(LLAMA3B), "--topology", str(CPU_ONLY))
    res = launcher("serve", "--plan", str(path), "--topology", str(CPU_ONLY), "--dry-run",
                   "--model", str(LLAMA8B))
    assert res.returncode == 0, res.stderr
    assert f"vllm serve {LLAMA8B} " in engine_line(res.stdout)
    (note,) = [ln for ln in res.stdout.splitlines() if "note: the plan" in ln]
    assert f"was made for {LLAMA3B}, not --model {LLAMA8B}" in note


def test_a_local_folder_is_not_taken_for_the_hub_model_the_plan_was_made_for(
        tmp_path: Path) -> None:
    # a plan for a hub id, served with a local folder of the same name: which revision the
    # folder holds is not checked, so it is refused (before any hub lookup)
    path = saved_plan(tmp_path, "--model", str(LLAMA3B), "--topology", str(CPU_ONLY))
    data = json.loads(path.read_text())
    data.update(model_ref="meta-llama/Llama-3.2-3B", revision="main", served_name=None)
    path.write_text(json.dumps(data))
    line = one_line_error(launcher("serve", "--plan", str(path), "--topology", str(CPU_ONLY),
                                   "--model", str(LLAMA3B), "--port", str(free_port())))
    assert "made for meta-llama/Llama-3.2-3B at revision main, not --model" in line
    assert "a local folder is not taken for a hub model" in line


def test_a_plans_model_folder_gone_from_this_machine_is_one_line(tmp_path: Path) -> None:
    copy = tmp_path / "llama-3.2-3b"
    shutil.copytree(LLAMA3B, copy)
    path = saved_plan(tmp_path, "--model", str(copy), "--topology", str(CPU_ONLY))
    shutil.rmtree(copy)
    line = one_line_error(launcher("serve", "--plan", str(path), "--topology", str(CPU_ONLY),
                                   "--dry-run"))
    assert f"made for the model at {copy}, which is not on this machine" in line


def older_file(path: Path) -> None:
    """The plan file as a release before the model record wrote it: the model's name only."""
    data = json.loads(path.read_text())
    for key in ("model_ref", "revision", "served_name", "config_sha256"):
        del data[key]
    path.write_text(json.dumps(data))


def test_an_older_plan_file_asks_for_model_unless_made_for_the_embedded_model(
        tmp_path: Path, tiny_model_path: str) -> None:
    path = saved_plan(tmp_path, "--model", str(LLAMA3B), "--topology", str(CPU_ONLY))
    older_file(path)
    line = one_line_error(launcher("serve", "--plan", str(path), "--topology", str(CPU_ONLY),
                                   "--dry-run"))
    assert "does not record which model it was made for (it names 'llama-3.2-3b')" in line
    assert "pass that model with --model" in line
    res = launcher("serve", "--plan", str(path), "--topology", str(CPU_ONLY), "--dry-run",
                   "--model", str(LLAMA3B))
    assert res.returncode == 0, res.stderr
    line = one_line_error(launcher("serve", "--plan", str(path), "--topology", str(CPU_ONLY),
                                   "--model", str(LLAMA8B), "--port", str(free_port())))
    assert "made for llama-3.2-3b, not --model" in line
    # an older plan of the embedded model (what `tune` wrote by default) serves it, as it did
    path = saved_plan(tmp_path, "--model", tiny_model_path, "--topology", str(CPU_ONLY))
    older_file(path)
    res = launcher("serve", "--plan", str(path), "--topology", str(CPU_ONLY), "--dry-run")
    assert res.returncode == 0, res.stderr
    assert f"vllm serve {tiny_model_path} " in engine_line(res.stdout)


def test_the_plan_tune_writes_records_its_model_and_serve_keeps_to_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from launcher.cli.cmd_tune import candidate_request, tuned_plan_json
    from launcher.cli.main import build_parser
    from launcher.pipeline.run import plan_and_render
    from launcher.tune.loop import parse_candidate

    for model, served in (((), "vllm serve "),
                          (("--model", str(LLAMA3B)), f"vllm serve {LLAMA3B} ")):
        args = build_parser().parse_args(["tune", *model, "--topology", str(CPU_ONLY)])
        request = candidate_request(args, parse_candidate("name=default"), ())
        path = tmp_path / "tuned.json"
        path.write_text(json.dumps(tuned_plan_json(plan_and_render(request.plan, os.environ))))
        assert main(["serve", "--plan", str(path), "--topology", str(CPU_ONLY), "--dry-run"]) == 0
        out = capsys.readouterr().out
        assert served in engine_line(out)
        assert ("tiny-llama" in engine_line(out)) == (not model)
        assert main(["serve", "--plan", str(path), "--topology", str(CPU_ONLY),
                     "--model", str(LLAMA8B), "--port", str(free_port())]) == 1
        (line,) = capsys.readouterr().err.splitlines()
        assert "was made for" in line
        assert capsys.readouterr().out == ""


def _plan(argv: list[str]) -> dict[str, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["plan", "--json", *argv]) == 0
    data: dict[str, Any] = json.loads(out.getvalue())
    return data


PLAN = _plan(["--model", str(LLAMA3B), "--topology", str(CPU_ONLY)])
TEXT = st.text(st.characters(codec=None), max_size=12) | st.text(
    st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF) | st.sampled_from("/.~\n\0a"),
    max_size=8)
VALUES = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), TEXT,
                   st.lists(TEXT, max_size=3), st.dictionaries(TEXT, st.integers(), max_size=2))


@settings(max_examples=80, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(["model_ref", "model", "revision", "served_name", "config_sha256"]),
       value=VALUES)
def test_a_garbled_model_record_is_a_one_line_error(
        key: str, value: object, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a garbled hub-like id: looked up in the cache
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({**PLAN, key: value}))
    code = main(["serve", "--plan", str(path), "--topology", str(CPU_ONLY), "--dry-run"])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    if key == "model_ref" and value != "embedded":  # no other text names a model here
        assert code != 0, out
    if code != 0:
        assert len(err.splitlines()) == 1, err
        assert out == ""
    else:  # a value a plan file may hold: the plan's own model is served all the same
        assert f"vllm serve {LLAMA3B} " in engine_line(out) or value == "embedded"
