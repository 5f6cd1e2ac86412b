"""One engine command: `plan` prints what `serve` runs, the user's flags come last, and later
stages change a copy of the typed value instead of editing strings."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.cli.main import main
from launcher.engine import failures
from launcher.engine.enginecmd import COMPILATION_CONFIG_SPELLINGS, EngineCommand, deep_merge
from launcher.errors import EngineError
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
        lambda xs: not any(x.startswith(COMPILATION_CONFIG_SPELLINGS) for x in xs)),
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


OURS = {"pass_config": {"fuse_allreduce_rms": False}}  # the symm-mem fallback's


def merged_user_value(*user: str) -> Any:
    """The --compilation-config value vLLM gets when a fallback's settings meet ``user``'s."""
    argv = EngineCommand("m", "h", 1, compilation_config=OURS, extra_args=user).argv()
    flags = [a for a in argv if a.startswith(COMPILATION_CONFIG_SPELLINGS)]
    assert len(flags) == 1, argv  # one flag: vLLM would keep only the last of two
    flag = flags[0]
    return json.loads(flag.split("=", 1)[1] if "=" in flag else argv[argv.index(flag) + 1])


def as_user_gives(spelling: str, equals: bool, value: str) -> tuple[str, ...]:
    return (f"{spelling}={value}",) if equals else (spelling, value)


@pytest.mark.parametrize("spelling", COMPILATION_CONFIG_SPELLINGS)
@pytest.mark.parametrize("equals", [False, True])
def test_the_users_compilation_object_keeps_its_keys_under_every_spelling_vllm_takes(
    spelling: str, equals: bool
) -> None:
    """-cc and --compilation_config are vLLM's too: not merged, the user's flag (last) would
    replace the fallback's settings, the fix a retry exists for."""
    user = as_user_gives(spelling, equals, '{"cudagraph_mode": "PIECEWISE"}')
    assert merged_user_value("--max-num-seqs", "4", *user) == {
        "cudagraph_mode": "PIECEWISE", **OURS}


@pytest.mark.parametrize("value", ["3", "0", '{"level":', "[]", "null", "None", "", '"{}"',
                                   "{'level': 3}", "level=3", '{"sizes": [1.5K]}'])
@pytest.mark.parametrize("spelling", COMPILATION_CONFIG_SPELLINGS)
@pytest.mark.parametrize("equals", [False, True])
def test_a_compilation_value_that_is_no_json_object_is_refused_in_one_line_not_read_as_empty(
    value: str, spelling: str, equals: bool
) -> None:
    """vLLM 0.32 takes only a JSON object for the flag (pydantic validates it as
    CompilationConfig; `3`, an older vLLM's level shorthand, exits 2). Read as {} it was
    replaced by the launcher's own settings without a word."""
    with pytest.raises(EngineError) as refused:
        merged_user_value(*as_user_gives(spelling, equals, value))
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"{spelling} {value!r} is not a JSON object")
    assert f"pass one, e.g. {spelling} '{{" in message
    assert ("-O" + value in message) == (value in ("3", "0"))  # a level has its own flag


def test_a_compilation_value_is_left_as_given_when_the_launcher_adds_nothing() -> None:
    """vLLM's own parser says what it thinks of a value nothing is merged into."""
    argv = EngineCommand("m", "h", 1, extra_args=("--compilation-config", "3")).argv()
    assert argv[-2:] == ("--compilation-config", "3")


def test_sized_numbers_are_read_as_vllm_reads_them_outside_strings() -> None:
    """vLLM 0.32 writes out `1k` (1000) and `2K` (2048) in a JSON flag before parsing it
    (engine/arg_utils.py _expand_json_human_readable_numbers); a string is left as it is."""
    user = ("-cc", '{"compile_sizes": [1k, 2K, 1.5m], "cache_dir": "/tmp/1k \\" 2K"}')
    assert merged_user_value(*user) == {
        "compile_sizes": [1000, 2048, 1500000], "cache_dir": '/tmp/1k " 2K', **OURS}


JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                      st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8))
JSON_VALUE = st.recursive(JSON_LEAF, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=8)
JSON_OBJECT = st.dictionaries(st.text(max_size=8), JSON_VALUE, max_size=4)
SPELLING = st.sampled_from(COMPILATION_CONFIG_SPELLINGS)


@settings(max_examples=300, deadline=None)
@given(obj=JSON_OBJECT, spelling=SPELLING, equals=st.booleans(), spaced=st.booleans())
def test_any_json_object_the_user_gives_is_merged_key_by_key(
    obj: dict[str, Any], spelling: str, equals: bool, spaced: bool
) -> None:
    text = json.dumps(obj, indent=1 if spaced else None)
    assert merged_user_value(*as_user_gives(spelling, equals, text)) == deep_merge(obj, OURS)


@settings(max_examples=300, deadline=None)
@given(obj=JSON_OBJECT.filter(bool), spelling=SPELLING, equals=st.booleans(), data=st.data())
def test_any_truncated_json_object_is_refused(
    obj: dict[str, Any], spelling: str, equals: bool, data: st.DataObject
) -> None:
    text = json.dumps(obj)
    cut = data.draw(st.integers(0, len(text) - 1))  # the closing brace is last: never whole
    with pytest.raises(EngineError, match="is not a JSON object"):
        merged_user_value(*as_user_gives(spelling, equals, text[:cut]))


@settings(max_examples=300, deadline=None)
@given(value=JSON_VALUE.filter(lambda v: not isinstance(v, dict)), spelling=SPELLING,
       equals=st.booleans())
def test_any_json_value_but_an_object_is_refused(value: Any, spelling: str, equals: bool) -> None:
    with pytest.raises(EngineError, match="is not a JSON object"):
        merged_user_value(*as_user_gives(spelling, equals, json.dumps(value)))


def gathered_as_vllm_does(argv: tuple[str, ...]) -> dict[str, Any]:
    """The object vLLM's parser makes of ``FLAG.a.b=VALUE`` / ``FLAG.a.b VALUE`` words (utils/
    argparse_utils.py, 0.32): keys split at the dots, the value read as JSON (else kept as the
    string it is), later words win."""
    gathered: dict[str, Any] = {}
    for i, word in enumerate(argv):
        flag = next((f for f in COMPILATION_CONFIG_SPELLINGS if word.startswith(f + ".")), None)
        if flag is None:
            continue
        name, value = word.split("=", 1) if "=" in word else (word, argv[i + 1])
        *path, leaf = name[len(flag) + 1:].split(".")
        node = gathered
        for key in path:
            node = node.setdefault(key, {})
        try:
            node[leaf] = json.loads(value)
        except ValueError:
            node[leaf] = value
    return gathered


@pytest.mark.parametrize("spelling", COMPILATION_CONFIG_SPELLINGS)
def test_the_fallbacks_settings_join_the_users_dotted_compilation_keys(spelling: str) -> None:
    """vLLM gathers `--compilation-config.KEY VALUE` flags into one object and passes it after
    every other flag: a whole --compilation-config of ours was replaced by it, and the retry
    ran without the fallback (checked with vLLM 0.32's parser). Ours goes in with the same
    spelling (vLLM's, `_` as `-`), before the user's keys, which win where both set one."""
    user = (f"{spelling}.cudagraph_mode", "PIECEWISE",
            f"{spelling}.pass_config.fuse_norm_quant=true")
    argv = EngineCommand("m", "h", 1, compilation_config=OURS, extra_args=user).argv()
    assert argv[-len(user):] == user
    assert not any(a == whole or a.startswith(whole + "=")  # no whole value: vLLM drops it
                   for a in argv for whole in COMPILATION_CONFIG_SPELLINGS)
    ours = [a for a in argv[:-len(user)] if a.startswith(COMPILATION_CONFIG_SPELLINGS)]
    assert ours == [f"{spelling.replace('_', '-')}.pass_config.fuse_allreduce_rms=false"]
    assert gathered_as_vllm_does(argv) == {
        "cudagraph_mode": "PIECEWISE",
        "pass_config": {"fuse_allreduce_rms": False, "fuse_norm_quant": True}}


KEY = st.from_regex(r"[a-z_]{1,8}", fullmatch=True)  # a config field's name: no dots
NESTED = st.recursive(JSON_LEAF | st.lists(JSON_LEAF, max_size=3),
                      lambda inner: st.dictionaries(KEY, inner, min_size=1, max_size=3),
                      max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(ours=st.dictionaries(KEY, NESTED, min_size=1, max_size=4), spelling=SPELLING)
def test_any_setting_of_ours_reaches_a_dotted_users_object_whole(
    ours: dict[str, Any], spelling: str
) -> None:
    argv = EngineCommand("m", "h", 1, compilation_config=ours,
                         extra_args=(f"{spelling}.mode", "3")).argv()
    assert gathered_as_vllm_does(argv) == deep_merge(ours, {"mode": 3})
