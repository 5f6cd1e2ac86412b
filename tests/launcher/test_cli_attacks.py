"""What a new user (or a careless script) types wrong on the command line, and what the commands
say back: one line that says what to do, before anything is started, never a traceback or a
silent change of what was asked."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from launcher.cli import cmd_tune
from launcher.cli.apikeys import collect_api_keys
from launcher.cli.main import build_parser, main
from launcher.engine.launchspec import LaunchSpec
from launcher.engine.serve import Runner, Supervision
from launcher.errors import LauncherError, PlanError
from launcher.model.modelspec import load_model_spec
from launcher.planner.plan import Policy, plan
from launcher.probe.topology import Topology
from server.config import config_from_args, load_keys


@pytest.mark.parametrize(
    ("flag", "value", "why"),
    [
        ("--tp", "3", "TP=3: 4 attention heads are not divisible by 3"),
        ("--pp", "5", "PP=5: more stages than the 4 layers"),
    ],
)
def test_a_split_the_cpu_engine_cannot_run_is_refused_in_words(
    capsys: pytest.CaptureFixture[str], tiny_model_path: str, flag: str, value: str, why: str
) -> None:
    code = main(["plan", "--model", tiny_model_path, flag, value])  # no GPU here: the CPU engine
    err = capsys.readouterr().err
    assert code == 3
    assert why in err
    assert "Rejection(" not in err  # the reason, not the record it is made from
    assert err.count("\n") == 1


def test_the_cpu_planner_refuses_a_split_with_the_rejections_reason(tiny_model_path: str) -> None:
    with pytest.raises(PlanError, match=r"^TP=3: 4 attention heads are not divisible by 3; "):
        plan(Topology(gpus=()), load_model_spec(tiny_model_path), Policy(force_tp=3))



# ------------------------------------------------------------------------------------ API keys

def _proxy_keys(keys: tuple[str, ...], tmp_path: Path) -> tuple[str, ...]:
    """The keys the proxy `launcher serve` starts ends up checking: its argv and environment as
    the launcher builds them, read by the proxy's own configuration."""
    spec = LaunchSpec(model_ref="m", served_name="m", host="127.0.0.1", port=8000,
                      api_keys=keys, replicas=(), plan_info={}, summary=())
    child = Runner(spec, Supervision(log_dir=tmp_path), Console())._proxy_child()
    argv = list(child.argv)
    config = config_from_args([*argv[argv.index("server") + 1:], "--upstream",
                               "http://127.0.0.1:9"], child.env)
    return config.api_keys


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flags=st.lists(st.text(st.characters(blacklist_categories=["Cs"],
                                            blacklist_characters="\x00"), max_size=6),
                      min_size=1, max_size=3))
def test_keys_given_to_serve_are_the_keys_its_proxy_checks_or_refused(
    flags: list[str], tmp_path: Path
) -> None:
    try:
        keys = collect_api_keys(flags, None, {})
    except LauncherError:
        return
    assert keys  # a key was asked for: the proxy never runs open to everyone
    assert _proxy_keys(keys, tmp_path) == keys
    # and the proxy started by hand with the same flags checks the same keys
    assert load_keys(flags, None, {}) == keys


@pytest.mark.parametrize(
    ("flags", "env", "says"),
    [
        ([""], {}, "--api-key was given an empty key"),  # --api-key "$KEY" with KEY unset
        (["  "], {}, "--api-key was given an empty key"),
        (["k"], {"TOPOSERVE_API_KEYS": " , "}, "holds no key"),
        (["team,ci"], {}, "comma"),
    ],
)
def test_serve_refuses_keys_its_proxy_would_read_otherwise(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    flags: list[str], env: dict[str, str], says: str,
) -> None:
    monkeypatch.delenv("TOPOSERVE_API_KEYS", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    argv = ["serve", "--dry-run", "--port", "0"]
    for key in flags:
        argv += ["--api-key", key]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 1
    assert says in err
    assert err.count("\n") == 1


# ---------------------------------------------------------------------- tune's output paths

class _NoStart:
    """A Tuner that fails the test if tune gets as far as starting a candidate."""

    def __init__(self, *args: object) -> None:
        raise AssertionError("tune started measuring with an output it cannot write")


@pytest.mark.parametrize(
    ("where", "says"),
    [
        (lambda tmp: ["--out", str(tmp / "missing" / "plan.json")], "--out"),
        (lambda tmp: ["--out", str(tmp)], "--out"),  # a folder
        (lambda tmp: ["--results-dir", str(_file(tmp / "taken"))], "--results-dir"),
        (lambda tmp: ["--results-dir", str(_file(tmp / "taken") / "sub")], "--results-dir"),
    ],
)
def test_tune_refuses_an_output_it_cannot_write_before_measuring(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    where: Callable[[Path], list[str]], says: str,
) -> None:
    monkeypatch.setattr(cmd_tune, "Tuner", _NoStart)
    code = main(["tune", "--candidate", "name=a", *where(tmp_path)])
    err = capsys.readouterr().err
    assert code == 1
    assert says in err
    assert err.count("\n") == 1


def _file(path: Path) -> Path:
    path.write_text("")
    return path


# ----------------------------------------------------------------------------------- --help

def _parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    from loadgen.cli import build_parser as loadgen_parser
    from server.config import build_parser as proxy_parser

    top = build_parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    return [*((f"launcher {n}", p) for n, p in sub.choices.items()),
            ("loadgen", loadgen_parser()), ("python -m server", proxy_parser())]


def _options(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in p._actions if a.option_strings and a.dest != "help"]


@pytest.mark.parametrize(("command", "parser"), _parsers(), ids=lambda x: str(x))
def test_a_default_the_help_states_is_the_one_the_command_takes(
    command: str, parser: argparse.ArgumentParser
) -> None:
    for action in _options(parser):
        stated = re.search(r"\bdefault:? ([0-9][0-9.,_]*[0-9]|[0-9])", action.help or "")
        value = action.default
        if stated is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        said = float(stated.group(1).replace(",", "").replace("_", ""))
        assert said == value, f"{command} {action.option_strings[-1]}: help says {said}, " \
            f"takes {value}"


@pytest.mark.parametrize("command", ["plan", "serve", "tune", "probe", "doctor", "model"])
def test_every_launcher_option_says_what_it_does(command: str) -> None:
    parser = dict(_parsers())[f"launcher {command}"]
    bare = [a.option_strings[-1] for a in _options(parser) if not (a.help or "").strip()]
    assert bare == []


# -------------------------------------------------------------------- the embedded model

def test_a_cache_the_embedded_model_cannot_be_made_in_says_which_and_what_to_set(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    cache = _file(tmp_path / "cache")  # a file where the folder should be
    monkeypatch.setenv("TOPOSERVE_CACHE", str(cache))
    code = main(["serve", "--dry-run", "--port", "0"])
    err = capsys.readouterr().err
    assert code == 1
    assert str(cache) in err
    assert "TOPOSERVE_CACHE" in err
    assert err.count("\n") == 1


# ------------------------------------------------------------------------------ path options

PATH_OPTIONS = [
    ("plan", "--topology"), ("plan", "--host-timing"), ("serve", "--topology"),
    ("serve", "--host-timing"), ("serve", "--api-key-file"), ("serve", "--plan"),
    ("serve", "--node-secret-file"), ("serve", "--log-dir"), ("tune", "--topology"),
    ("tune", "--out"), ("tune", "--results-dir"), ("tune", "--log-dir"),
    ("probe", "--save"), ("probe", "--topology"), ("doctor", "--topology"),
    ("plan", "--revision"), ("serve", "--revision"), ("model", "--revision"),
]


@pytest.mark.parametrize(("command", "flag"), PATH_OPTIONS)
def test_an_empty_path_is_refused_naming_the_option(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, command: str, flag: str
) -> None:
    # `--log-dir "$DIR"` with DIR unset would otherwise be '.', the folder the user is in
    monkeypatch.setattr(cmd_tune, "Tuner", _NoStart)
    more = {"plan": ["--model", "m"], "serve": ["--dry-run"]}.get(command, [])
    with pytest.raises(SystemExit) as exc:
        main([command, flag, "", *more])
    assert exc.value.code == 2
    assert f"argument {flag}: must not be empty" in capsys.readouterr().err


def test_a_key_file_key_no_environment_can_carry_is_refused(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("team\x00ci\n")
    keys.chmod(0o600)
    with pytest.raises(LauncherError, match="NUL"):
        collect_api_keys([], keys, {})


@pytest.mark.parametrize("command", ["python -m server", "loadgen"])
def test_every_option_with_a_number_for_default_states_it(command: str) -> None:
    parser = dict(_parsers())[command]
    silent = [a.option_strings[-1] for a in _options(parser)
              if isinstance(a.default, (int, float)) and not isinstance(a.default, bool)
              and not re.search(r"\bdefault:? [0-9]", a.help or "")]
    assert silent == []
