"""The embedded model's stamp: a damaged one makes the model again instead of a traceback."""
from __future__ import annotations

from pathlib import Path

import pytest

from launcher.model import tinymodel


def _counting_generate(calls: list[Path]) -> object:
    def generate(out: Path, recipe: tinymodel.TinyRecipe) -> None:
        calls.append(out)
        (out / "config.json").write_text("{}")
    return generate


@pytest.mark.parametrize("stamp_bytes", [
    b"", b"{", b"\xff\xfe\x00garbage", b"[1, 2]", b'"fingerprint"', b"null",
    b'{"fingerprint": 3}', b"[" * 100_000,
])
def test_a_damaged_stamp_makes_the_model_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               stamp_bytes: bytes) -> None:
    recipe = tinymodel.TinyRecipe()
    env = {"TOPOSERVE_CACHE": str(tmp_path)}
    target = tinymodel.model_dir(tinymodel.default_cache_dir(env), recipe)
    target.mkdir(parents=True)
    (target / "toposerve-recipe.json").write_bytes(stamp_bytes)
    calls: list[Path] = []
    monkeypatch.setattr(tinymodel, "_generate", _counting_generate(calls))
    assert tinymodel.ensure_tiny_model(env, recipe) == target
    assert len(calls) == 1
    assert (target / "config.json").is_file()


def test_a_matching_stamp_keeps_the_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = tinymodel.TinyRecipe()
    env = {"TOPOSERVE_CACHE": str(tmp_path)}
    calls: list[Path] = []
    monkeypatch.setattr(tinymodel, "_generate", _counting_generate(calls))
    first = tinymodel.ensure_tiny_model(env, recipe)
    assert tinymodel.ensure_tiny_model(env, recipe) == first
    assert len(calls) == 1


@pytest.mark.parametrize("argv", [["probe", "--measure"], ["serve", "--dry-run", "--port", "0"]])
def test_a_cache_that_is_a_file_is_one_line_for_every_command_that_makes_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    argv: list[str],
) -> None:
    from launcher.cli.main import main

    cache = tmp_path / "cache"
    cache.write_text("a file where the cache folder should be")
    monkeypatch.setenv("TOPOSERVE_CACHE", str(cache))
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert str(cache) in err
    assert "TOPOSERVE_CACHE" in err
    assert err.count("\n") == 1
