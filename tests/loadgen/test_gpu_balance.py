"""GPU balance: toposerve's GPU metrics sampled during a run, per GPU, with the sleeping-card
flag. Fed by metrics recorded on a real 2xH200 machine (tests/deploy/recorded), replayed by a
loopback server, and by variants of them in which one card does less."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from loadgen.gpus import balance, has_gpu_metrics, readings
from tests.loadgen.conftest import run_cli
from tests.loadgen.standin import spawn

RECORDED = Path(__file__).resolve().parents[1] / "deploy" / "recorded"
SCRAPES = [RECORDED / "h200x2-scrape1.prom", RECORDED / "h200x2-scrape2.prom"]


def _set(text: str, metric: str, gpu: str, value: float) -> str:
    pattern = re.compile(rf'^({re.escape(metric)}\{{gpu="{gpu}",[^}}]*\}}) .*$', re.M)
    out, n = pattern.subn(lambda m: f"{m.group(1)} {value}", text)
    assert n == 1
    return out


def _uneven(text: str) -> str:
    """The recorded scrape with GPU 0 busy and GPU 1 nearly idle (a split that leaves it)."""
    text = _set(text, "toposerve_gpu_utilization_ratio", "0", 0.92)
    text = _set(text, "toposerve_gpu_utilization_ratio", "1", 0.2)
    text = _set(text, "toposerve_gpu_power_watts", "0", 610.0)
    return _set(text, "toposerve_gpu_power_watts", "1", 140.0)


def test_recorded_h200_metrics_read_per_gpu() -> None:
    rows = readings(SCRAPES[0].read_text())
    assert [(r.gpu, r.name) for r in rows] == [("0", "NVIDIA H200"), ("1", "NVIDIA H200")]
    assert [r.power_w for r in rows] == pytest.approx([104.932, 106.356])
    assert has_gpu_metrics(SCRAPES[0].read_text())
    assert not has_gpu_metrics("vllm:num_requests_running 0\n")
    assert readings("not { prometheus") == []


def test_two_idle_cards_drawing_similar_power_are_not_flagged() -> None:
    g = balance([p.read_text() for p in SCRAPES], 1.0)
    assert [s.gpu for s in g.per_gpu] == ["0", "1"]
    assert g.per_gpu[0].power_mean_w == pytest.approx((104.932 + 81.449) / 2)
    assert g.per_gpu[1].util_max == 0.0
    assert g.flagged == ()  # both idle: busy shares are not compared, power is within half


def test_a_card_at_less_than_half_the_busy_share_or_power_of_the_other_is_flagged() -> None:
    g = balance([_uneven(p.read_text()) for p in SCRAPES], 1.0)
    assert [f.gpu for f in g.flagged] == ["1"]
    assert "busy 20% against the busiest GPU's 92%" in g.flagged[0].reason
    assert "power 140 W against the highest 610 W" in g.flagged[0].reason
    assert "below 50%" in g.rule


def test_one_gpu_has_nothing_to_be_compared_with() -> None:
    one = "\n".join(ln for ln in SCRAPES[0].read_text().splitlines() if 'gpu="1"' not in ln)
    assert balance([one], 1.0).flagged == ()


@pytest.mark.parametrize("uneven", [False, True])
def test_a_run_samples_the_targets_gpu_metrics_and_reports_them_per_gpu(
    tiny_model_path: str, tmp_path: Path, uneven: bool
) -> None:
    files = SCRAPES
    if uneven:
        files = [tmp_path / p.name for p in SCRAPES]
        for src, dst in zip(SCRAPES, files, strict=True):
            dst.write_text(_uneven(src.read_text()))
    out = tmp_path / "r.json"
    args = ("--tokenizer", tiny_model_path, "--itl", "0.01", "--gpu-metrics", *map(str, files))
    with spawn(*args) as url:
        result = run_cli(
            "--url", url, "--prompt", "64", "--gen", "40", "--requests", "4", "--concurrency",
            "2", "--gpu-sample", "0.1", "--json", str(out), "--no-progress",
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    gpus = json.loads(out.read_text())["gpus"]
    assert gpus["scrapes"] >= 2
    assert [g["gpu"] for g in gpus["per_gpu"]] == ["0", "1"]
    assert "GPU 0 (NVIDIA H200): busy" in result.stdout
    if uneven:
        assert [f["gpu"] for f in gpus["flagged"]] == ["1"]
        assert "warning: GPU 1 stays well below the others" in result.stdout
    else:
        assert gpus["flagged"] == []
        assert "warning: GPU" not in result.stdout


def test_a_target_without_gpu_metrics_gets_no_gpu_section(
    tiny_model_path: str, tmp_path: Path
) -> None:
    out = tmp_path / "r.json"
    with spawn("--tokenizer", tiny_model_path) as url:
        result = run_cli(
            "--url", url, "--prompt", "32", "--gen", "4", "--requests", "2", "--json", str(out)
        )
    assert result.returncode == 0, result.stderr
    assert "gpus" not in json.loads(out.read_text())


def test_gpu_sample_zero_turns_the_sampling_off(tiny_model_path: str, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    args = ("--tokenizer", tiny_model_path, "--gpu-metrics", *map(str, SCRAPES))
    with spawn(*args) as url:
        result = run_cli(
            "--url", url, "--prompt", "32", "--gen", "4", "--requests", "2",
            "--gpu-sample", "0", "--json", str(out),
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "gpus" not in json.loads(out.read_text())
