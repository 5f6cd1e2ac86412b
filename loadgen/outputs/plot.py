"""--plot: prefill and decode against concurrency for a sweep (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path

from loadgen.errors import ExportError
from loadgen.outputs.results import Report


def sweep_series(report: Report) -> dict[str, list[float | None]]:
    """The plotted numbers, pure: one value per level, None where there were no samples."""
    levels = report.levels
    return {
        "concurrency": [float(lv.concurrency or 0) for lv in levels],  # never None in a sweep
        "prefill_p50": [lv.summary.prefill_tok_s.p50 for lv in levels],
        "decode_p50": [lv.summary.decode_tok_s.p50 for lv in levels],
        "ttft_p50_ms": [
            lv.summary.ttft_s.p50 * 1000 if lv.summary.ttft_s.p50 else None for lv in levels
        ],
        "output_tok_s": [lv.summary.output_tok_s for lv in levels],
    }


def draw(report: Report, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers
    import matplotlib.pyplot as plt

    s = sweep_series(report)
    x = [float(c or 0) for c in s["concurrency"]]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    panels = [
        (axes[0], "prefill tok/s per request (p50)", ["prefill_p50"]),
        (axes[1], "decode tok/s per request (p50)", ["decode_p50"]),
        (axes[2], "aggregate output tok/s", ["output_tok_s"]),
    ]
    for ax, title, keys in panels:
        for key in keys:
            ax.plot(x, [v if v is not None else float("nan") for v in s[key]], marker="o")
        ax.set_title(title)
        ax.set_xlabel("concurrent streams")
        ax.set_xscale("log", base=2)
        ax.set_xticks(x, [str(int(c)) for c in x])
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("prefill tok/s (p50)", color="tab:blue")
    axes[1].set_ylabel("decode tok/s (p50)")
    axes[2].set_ylabel("output tok/s, all streams")
    twin = axes[0].twinx()
    twin.plot(
        x,
        [v if v is not None else float("nan") for v in s["ttft_p50_ms"]],
        color="tab:red",
        linestyle="--",
        marker="x",
    )
    twin.set_ylabel("TTFT p50 ms", color="tab:red")
    cfg = report.config
    fig.suptitle(
        f"{report.target.model}  prompt {cfg.prompt} / gen {cfg.gen}  plan {report.target.plan}"
    )
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=100)
    except OSError as exc:
        raise ExportError(
            f"cannot write {path}: {exc.strerror or exc}; pick a writable path"
        ) from None
    finally:
        plt.close(fig)
