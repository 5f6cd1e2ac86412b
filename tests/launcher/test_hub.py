"""`--model org/name` from the hub: huggingface_hub against a stand-in hub on loopback (reached
through HF_ENDPOINT, with HF_HOME in a temporary folder), as a user on a fresh machine meets it:
a public model plans, a gated or missing one and an offline machine without a copy each end in
one line saying what to do, a fetched model plans again offline, and --revision picks the files.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher.cli.main import main
from launcher.errors import ModelError
from launcher.model.modelspec import load_model_spec
from tests.launcher.paths import H200, MODELS, REPO
from tests.launcher.standin_hub import Repo, StandinHub, commit_of

LLAMA = json.loads((MODELS / "llama-3.3-70b" / "config.json").read_text())
# What Llama-3.3-70B-Instruct's model.safetensors.index.json says: 141,107,412,992 bytes of bf16.
TOTAL_SIZE = 141_107_412_992
MAIN, V2 = commit_of("main"), commit_of("v2")
# What planning fetches of a repository, and all it asks for: config, index, the two small
# configs and the chat template (its tool-call markers pick the parser), never a weight file.
PLANNING_FILES = {
    "config.json",
    "model.safetensors.index.json",
    "generation_config.json",
    "tokenizer_config.json",
    "chat_template.jinja",
}


def files(config: dict[str, object], index: bool = True) -> dict[str, bytes]:
    out = {
        "config.json": json.dumps(config).encode(),
        "generation_config.json": b'{"bos_token_id": 128000, "temperature": 0.6}',
        "tokenizer_config.json": b'{"chat_template": "{{ messages }}"}',
        "model-00001-of-00030.safetensors": b"not fetched",
        "chat_template.jinja": b"{{ messages }}",
    }
    if index:
        out["model.safetensors.index.json"] = json.dumps(
            {"metadata": {"total_size": TOTAL_SIZE}, "weight_map": {"lm_head.weight": "x"}}
        ).encode()
    return out


@pytest.fixture
def hub() -> Iterator[StandinHub]:
    repos = {
        "meta-llama/Llama-3.3-70B-Instruct": Repo(
            commits={MAIN: files(LLAMA), V2: files({**LLAMA, "num_hidden_layers": 40}, False)},
            refs={"main": MAIN, "v2": V2},
        ),
        "mirror/config-only": Repo(
            commits={MAIN: {"config.json": json.dumps(LLAMA).encode()}},
            refs={"main": MAIN},
            lists_files=False,
        ),
        "quant-org/Llama-3.3-70B-Instruct-GGUF": Repo(
            commits={MAIN: {"Llama-3.3-70B-Instruct-Q4_K_M.gguf": b"GGUF\x03\x00\x00\x00",
                            "README.md": b"# GGUF"}},
            refs={"main": MAIN},
        ),
        "gated-org/licensed-70b": Repo(
            commits={MAIN: files(LLAMA)},
            refs={"main": MAIN},
            gated=True,
            readers=frozenset({"hf_ok"}),
        ),
    }
    standin = StandinHub(repos).start()
    yield standin
    standin.stop()


@pytest.fixture
def env(hub: StandinHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """What a fresh machine has: the hub's address, an empty HF_HOME, no token, online."""
    for name in (
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    return {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf")}


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def assert_one_line_error(code: int, err: str, *parts: str) -> None:
    assert code == 1, err
    assert err.startswith("launcher: error: "), err
    assert err.count("\n") == 1, err
    for part in parts:
        assert part in err, err


def test_a_public_hub_model_plans_from_its_fetched_config(
    hub: StandinHub, env: dict[str, str]
) -> None:
    code, out, err = run_cli(
        "plan", "--topology", str(H200), "--model", "meta-llama/Llama-3.3-70B-Instruct"
    )
    assert code == 0, err
    assert out.startswith("plan: tp (tp=2")
    assert "vllm serve meta-llama/Llama-3.3-70B-Instruct" in out
    assert "/api/models/meta-llama/Llama-3.3-70B-Instruct/revision/main" in hub.paths()
    fetched = {p.rsplit("/", 1)[1] for p in hub.paths() if "/resolve/main/" in p}
    assert fetched == PLANNING_FILES  # the weights are left to vLLM
    snapshot = Path(env["HF_HOME"]) / "hub" / "models--meta-llama--Llama-3.3-70B-Instruct"
    assert (snapshot / "snapshots" / MAIN / "config.json").is_file()


def test_the_parameter_count_comes_from_the_safetensors_index(
    hub: StandinHub, env: dict[str, str]
) -> None:
    m = load_model_spec("meta-llama/Llama-3.3-70B-Instruct", env)
    assert m.params == TOTAL_SIZE // 2  # bf16: two bytes a parameter
    assert m.weight_bytes == TOTAL_SIZE
    assert m.name == "meta-llama/Llama-3.3-70B-Instruct"
    # config.json alone: the formulas count Llama exactly, so the two agree here
    assert load_model_spec(str(MODELS / "llama-3.3-70b")).params == m.params


@pytest.mark.parametrize(
    ("config", "total", "params", "weight_bytes"),
    [
        # weights the formulas do not know of (an extra head, say): the checkpoint wins
        (LLAMA, 150_000_000_000, 75_000_000_000, 150_000_000_000),
        # a float32 checkpoint holds 4 bytes a parameter and is served in 16 bits
        ({**LLAMA, "torch_dtype": "float32"}, 282_214_825_984, TOTAL_SIZE // 2, TOTAL_SIZE),
        # a quantized one loads as stored: its bytes are the weights' (vLLM's repacking adds
        # load_growth_bytes to them, as to the estimate), the count stays
        (
            json.loads((MODELS / "llama-3.3-70b-awq" / "config.json").read_text()),
            39_000_000_000,
            None,
            39_000_000_000,
        ),
    ],
)
def test_the_checkpoint_size_replaces_the_estimate(
    tmp_path: Path, config: dict[str, object], total: int, params: int | None, weight_bytes: int
) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    estimate = load_model_spec(str(folder), {})
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": {}})
    )
    m = load_model_spec(str(folder), {})
    assert m.params == (estimate.params if params is None else params)
    assert m.weight_bytes == weight_bytes + m.load_growth_bytes
    assert m.active_params == m.params


@pytest.mark.parametrize(
    "index", ["{", "[]", '{"metadata": {"total_size": "lots"}}', '{"metadata": null}']
)
def test_an_unreadable_index_leaves_the_estimate(tmp_path: Path, index: str) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA))
    estimate = load_model_spec(str(folder), {})
    (folder / "model.safetensors.index.json").write_text(index)
    assert load_model_spec(str(folder), {}) == estimate


def test_a_gated_model_without_access_says_to_accept_its_licence_and_set_hf_token(
    hub: StandinHub, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run_cli("plan", "--topology", str(H200), "--model", "gated-org/licensed-70b")
    assert_one_line_error(
        code, err, "gated", "accept its licence", f"{hub.url}/gated-org/licensed-70b", "HF_TOKEN"
    )
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    code, _, err = run_cli("plan", "--topology", str(H200), "--model", "gated-org/licensed-70b")
    assert_one_line_error(code, err, "HF_TOKEN is set, but its account has no access yet")
    monkeypatch.setenv("HF_TOKEN", "hf_ok")
    code, _, err = run_cli("plan", "--topology", str(H200), "--model", "gated-org/licensed-70b")
    assert code == 0, err
    assert hub.seen[-1].authorization == "Bearer hf_ok"  # the token reached the hub


def test_a_model_that_does_not_exist_says_so_in_one_line(
    hub: StandinHub, env: dict[str, str]
) -> None:
    code, _, err = run_cli("plan", "--topology", str(H200), "--model", "no-org/no-such-model")
    assert_one_line_error(code, err, "'no-org/no-such-model' not found on", hub.url, "HF_TOKEN")


def test_a_fetched_model_plans_again_offline_and_with_the_hub_gone(
    hub: StandinHub, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    online = load_model_spec("meta-llama/Llama-3.3-70B-Instruct", env)
    asked = len(hub.seen)
    offline = load_model_spec("meta-llama/Llama-3.3-70B-Instruct", {**env, "HF_HUB_OFFLINE": "1"})
    assert offline == online
    assert len(hub.seen) == asked  # offline means no request at all
    hub.stop()  # the hub out of reach, HF_HUB_OFFLINE unset: the cache still serves
    assert load_model_spec("meta-llama/Llama-3.3-70B-Instruct", env) == online
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, _, err = run_cli(
        "plan", "--topology", str(H200), "--model", "meta-llama/Llama-3.3-70B-Instruct"
    )
    assert code == 0, err


def test_offline_with_nothing_cached_says_so_in_one_line(
    hub: StandinHub, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, _, err = run_cli(
        "plan", "--topology", str(H200), "--model", "meta-llama/Llama-3.3-70B-Instruct"
    )
    assert_one_line_error(
        code, err, "HF_HUB_OFFLINE is set", "not in the cache", "unset HF_HUB_OFFLINE"
    )
    assert hub.seen == []


def test_an_unreachable_hub_with_nothing_cached_says_so_in_one_line(
    hub: StandinHub, env: dict[str, str]
) -> None:
    hub.stop()
    with pytest.raises(ModelError, match=r"cannot reach http://127\.0\.0\.1:\d+ to fetch") as exc:
        load_model_spec("meta-llama/Llama-3.3-70B-Instruct", env)
    assert "\n" not in str(exc.value)


def test_revision_picks_the_files_of_that_branch_tag_or_commit(
    hub: StandinHub, env: dict[str, str]
) -> None:
    assert load_model_spec("meta-llama/Llama-3.3-70B-Instruct", env).num_layers == 80
    for rev in ("v2", V2):
        m = load_model_spec("meta-llama/Llama-3.3-70B-Instruct", env, revision=rev)
        assert m.num_layers == 40
    assert "/api/models/meta-llama/Llama-3.3-70B-Instruct/revision/v2" in hub.paths()
    code, out, err = run_cli(
        "plan",
        "--topology",
        str(H200),
        "--model",
        "meta-llama/Llama-3.3-70B-Instruct",
        "--revision",
        "v2",
        "--json",
    )
    assert code == 0, err
    planned = json.loads(out)
    assert any("40" in r for r in planned["reasons"])
    argv = planned["argv"]
    assert argv[argv.index("--revision") + 1] == "v2"  # vLLM loads what was planned
    # offline, a revision fetched before is still there
    again = load_model_spec(
        "meta-llama/Llama-3.3-70B-Instruct", {**env, "HF_HUB_OFFLINE": "1"}, revision="v2"
    )
    assert again.num_layers == 40


def test_an_unknown_revision_and_a_revision_of_a_local_folder_are_one_line_errors(
    hub: StandinHub, env: dict[str, str]
) -> None:
    code, _, err = run_cli(
        "plan",
        "--topology",
        str(H200),
        "--model",
        "meta-llama/Llama-3.3-70B-Instruct",
        "--revision",
        "v9",
    )
    assert_one_line_error(code, err, "has no revision 'v9'")
    code, _, err = run_cli(
        "plan", "--topology", str(H200), "--model", str(MODELS / "mistral-7b"), "--revision", "v2"
    )
    assert_one_line_error(code, err, "--revision is for a hub model")


def test_a_reference_that_is_neither_a_folder_nor_a_hub_id_says_so(env: dict[str, str]) -> None:
    with pytest.raises(ModelError, match=r"not a local folder or config\.json, and not a Hugging"):
        load_model_spec("./no/such/folder", env)


def test_serve_dry_run_and_tune_take_the_hub_model_and_revision(
    hub: StandinHub, env: dict[str, str]
) -> None:
    # scripts/quickstart.sh --model org/name runs `launcher serve` with these arguments.
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "launcher",
            "serve",
            "--dry-run",
            "--topology",
            str(H200),
            "--model",
            "meta-llama/Llama-3.3-70B-Instruct",
            "--revision",
            "main",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )
    assert res.returncode == 0, res.stderr
    assert "--tensor-parallel-size 2" in res.stdout
    assert "--revision main" in res.stdout
    assert "Traceback" not in res.stderr


def test_the_environment_given_decides_offline_not_the_one_at_import(
    hub: StandinHub, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    # as if huggingface_hub had been imported under HF_HUB_OFFLINE=1 (another test, a parent)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert load_model_spec("meta-llama/Llama-3.3-70B-Instruct", env).num_layers == 80
    assert constants.HF_HUB_OFFLINE is True  # left as it was found


def test_a_hub_that_lists_no_files_is_asked_for_each_and_missing_ones_are_skipped(
    hub: StandinHub, env: dict[str, str]
) -> None:
    m = load_model_spec("mirror/config-only", env)
    assert m.num_layers == 80
    asked = {p.rsplit("/", 1)[1] for p in hub.paths() if "/resolve/" in p}
    # each asked for (ModelOpt's hf_quant_config.json too, which no repository here has), the
    # five it lacks answered 404 EntryNotFound and skipped
    assert asked == PLANNING_FILES | {"hf_quant_config.json"}


def test_a_gguf_only_repository_says_what_to_pass_instead(
    hub: StandinHub, env: dict[str, str]
) -> None:
    code, _, err = run_cli(
        "plan", "--topology", str(H200), "--model", "quant-org/Llama-3.3-70B-Instruct-GGUF"
    )
    assert_one_line_error(code, err, "holds GGUF files", "pass the original model")


def test_a_hub_page_url_plans_the_model_it_shows(hub: StandinHub, env: dict[str, str]) -> None:
    code, out, err = run_cli(
        "plan", "--topology", str(H200), "--model", f"{hub.url}/meta-llama/Llama-3.3-70B-Instruct"
    )
    assert code == 0, err
    assert "vllm serve meta-llama/Llama-3.3-70B-Instruct" in out


@pytest.mark.parametrize(("name", "content", "says"), [
    ("model-Q4_K_M.gguf", b"GGUF\x03\x00\x00\x00\x00", "is a GGUF file"),
    ("model.safetensors", b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ", "is a weights file"),
    ("notes.txt", b"hello", "cannot read"),
])
def test_a_weights_file_given_as_the_model_says_what_to_pass(
    tmp_path: Path, name: str, content: bytes, says: str
) -> None:
    (tmp_path / name).write_bytes(content)
    code, _, err = run_cli("plan", "--topology", str(H200), "--model", str(tmp_path / name))
    assert_one_line_error(code, err, says)


def test_a_folder_of_gguf_files_says_what_to_pass(tmp_path: Path) -> None:
    (tmp_path / "model-Q4_K_M.gguf").write_bytes(b"GGUF\x03\x00\x00\x00")
    code, _, err = run_cli("plan", "--topology", str(H200), "--model", str(tmp_path))
    assert_one_line_error(code, err, "holds GGUF files", "pass the original model")


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(head=st.sampled_from([b"", b"GGUF", b"{", b"\x08\x00\x00\x00"]),
       rest=st.binary(max_size=60),
       suffix=st.sampled_from([".gguf", ".safetensors", ".bin", ".json", ".txt", ""]))
def test_any_file_given_as_the_model_plans_or_is_one_line(
        tmp_path: Path, head: bytes, rest: bytes, suffix: str) -> None:
    f = tmp_path / f"model{suffix}"
    f.write_bytes(head + rest)
    code, _, err = run_cli("plan", "--topology", str(H200), "--model", str(f))
    assert code == 0 or (err.startswith("launcher: error: ") and err.count("\n") == 1), err
