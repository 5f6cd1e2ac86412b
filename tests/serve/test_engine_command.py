"""One engine command: `plan` prints what `serve` runs, the user's flags come last, and later
stages change a copy of the typed value instead of editing strings."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.cli.main import main
from launcher.engine import failures
from launcher.engine.enginecmd import EngineCommand
from tests.conftest import REPO, TOPOLOGIES
from tests.serve.standin_engine import SYMM_MEM_CRASH

H200 = str(TOPOLOGIES / "h200x2-nvlink.nvml.json")
LLAMA70B = str(REPO / "benchmarks" / "gpu" / "models" / "llama-3.3-70b-shape")
QWEN32 = str(REPO / "benchmarks" / "gpu" / "models" / "qwen2.5-32b-shape")


def plan_engines(capsys: pytest.CaptureFixture[str], *args: str) -> list[tuple[dict[str, str],
                                                                                list[str]]]:
    assert main(["plan", "--json", "--port", "9100", *args]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["argv"] == data["engines"][0]["argv"]
    return [(e["env"], e["argv"]) for e in data["engines"]]


def served_engines(capsys: pytest.CaptureFixture[str], *args: str
                   ) -> list[tuple[dict[str, str], list[str]]]:
    """The engine lines `serve --dry-run` prints, split back into (env, argv)."""
    assert main(["serve", "--dry-run", "--port", "0", "--engine-port", "9100", *args]) == 0
    out = []
    for line in capsys.readouterr().out.splitlines():
        if line.strip().startswith("engine:"):
            words = shlex.split(line.split("engine:", 1)[1])
            at = words.index("vllm")
            out.append((dict(w.split("=", 1) for w in words[:at]), words[at:]))
    return out


@pytest.mark.parametrize(
    "args",
    [
        ("--topology", H200, "--model", LLAMA70B),  # TP=2 over NVLink
        ("--topology", H200, "--model", QWEN32, "--dp", "2"),  # two replicas
        ("--topology", H200, "--model", LLAMA70B, "--nodes", "2", "--network-gbps", "25",
         "--ray-address", "10.0.0.5:6379"),
        ("--pp", "2", "--trust-remote-code", "--prompt", "64", "--gen", "8", "--",
         "--max-num-seqs", "7"),  # the embedded model on the CPU engine
    ],
    ids=["tp2", "dp2", "two-nodes", "cpu-pp2-extra"],
)
def test_serve_and_plan_render_the_same_engine_command(
    capsys: pytest.CaptureFixture[str], tiny_model_path: str, args: tuple[str, ...]
) -> None:
    # plan needs --model; serve's default is the embedded model, named here for both
    with_model = args if "--model" in args else ("--model", tiny_model_path, *args)
    planned = plan_engines(capsys, *with_model)
    served = served_engines(capsys, *with_model)
    assert served == planned
    if "--dp" in args:
        # replicas are separate servers on their own GPU and port, not vLLM's own DP flag
        assert [argv[argv.index("--port") + 1] for _, argv in served] == ["9100", "9101"]
        assert [env["CUDA_VISIBLE_DEVICES"] for env, _ in served] == ["0", "1"]
        assert all("--data-parallel-size" not in argv for _, argv in served)


def test_user_extra_args_come_last(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                   tiny_model_path: str) -> None:
    (_env, argv), = served_engines(capsys, "--trust-remote-code", "--", "--max-num-seqs", "7")
    assert argv[-2:] == ["--max-num-seqs", "7"]
    assert "--trust-remote-code" in argv
    # a tuned plan's flags come before the ones given now, and both after ours
    assert main(["plan", "--json", "--model", tiny_model_path]) == 0
    saved = json.loads(capsys.readouterr().out)
    saved["vllm_extra_args"] = ["--max-num-seqs", "3"]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(saved))
    (_env, argv), = served_engines(capsys, "--plan", str(path), "--trust-remote-code", "--",
                                  "--max-num-seqs", "9")
    assert argv[-4:] == ["--max-num-seqs", "3", "--max-num-seqs", "9"]


def test_a_fallback_changes_a_copy_of_the_command() -> None:
    cmd = EngineCommand("m", "127.0.0.1", 9000, tp=2, env={"CUDA_VISIBLE_DEVICES": "0,1"},
                        extra_args=("--max-num-seqs", "4"))
    diag = failures.diagnose(SYMM_MEM_CRASH)
    assert diag is not None
    changed = diag.apply(cmd)
    assert cmd.env == {"CUDA_VISIBLE_DEVICES": "0,1"}  # the original is untouched
    assert "--compilation-config" not in cmd.argv()
    assert changed.env == {"CUDA_VISIBLE_DEVICES": "0,1", "VLLM_ALLREDUCE_USE_SYMM_MEM": "0"}
    assert changed.argv()[-2:] == ("--max-num-seqs", "4")
    assert replace(changed, max_model_len=2048).argv().count("--max-model-len") == 1


def test_a_json_flag_given_with_equals_is_merged_not_repeated() -> None:
    cmd = EngineCommand("m", "h", 1, compilation_config={"pass_config": {"x": False}},
                        extra_args=('--compilation-config={"level": 3}',))
    argv = cmd.argv()
    assert sum(a.startswith("--compilation-config") for a in argv) == 1
    assert json.loads(argv[-1].split("=", 1)[1]) == {"level": 3, "pass_config": {"x": False}}


FLAG = st.from_regex(r"--[a-z][a-z-]{0,20}", fullmatch=True)
WORD = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(
    extra=st.lists(st.one_of(FLAG, WORD), max_size=8).filter(
        lambda xs: not any(x.startswith("--compilation-config") for x in xs)),
    tp=st.integers(1, 8), pp=st.integers(1, 4), trust=st.booleans(),
    backend=st.sampled_from([None, "ray", "mp"]), no_car=st.booleans(),
    parser=st.sampled_from([None, "hermes"]), compilation=st.booleans(),
)
def test_user_extra_args_are_last_for_any_command(
    extra: list[str], tp: int, pp: int, trust: bool, backend: str | None, no_car: bool,
    parser: str | None, compilation: bool,
) -> None:
    cmd = EngineCommand("m", "127.0.0.1", 8000, tp=tp, pp=pp, trust_remote_code=trust,
                        distributed_backend=backend, disable_custom_all_reduce=no_car,
                        tool_parser=parser, extra_args=tuple(extra),
                        compilation_config={"level": 1} if compilation else {})
    argv = cmd.argv()
    assert argv[:3] == ("vllm", "serve", "m")
    assert argv[len(argv) - len(extra):] == tuple(extra)
    assert argv.count("--compilation-config") == int(compilation)
    assert ("--trust-remote-code" in argv[:len(argv) - len(extra)]) == trust
