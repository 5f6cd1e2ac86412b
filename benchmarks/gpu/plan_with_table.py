"""Plan with a kernel table measured on another machine (issue 22): `launcher plan ARGS`, with
TABLE (a `probe --measure --model` record, e.g. from a lent GPU's kernel cache) standing in for
the table this machine would keep under its own key (device, driver, vLLM and torch versions).

    python benchmarks/gpu/plan_with_table.py TABLE.json --model M --topology SAVED ... [-- FLAGS]

The table is used for the shape it was timed for; the rest of the plan is this checkout's.
Agreement with a reading already made, not a prediction made before it.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from launcher.cli.main import main
from launcher.probe import kernelprobe, kernels
from launcher.probe.kernels import KernelTable, TableKey


def run(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    table = kernels.table_from_json(json.loads(Path(argv[0]).read_text()))

    def kept(cache_dir: Path, key: TableKey) -> KernelTable | None:
        return replace(table, key=key) if key.shape == table.key.shape else None

    kernelprobe.cached_table = kept  # the one seam a plan reads kept tables through
    return main(["plan", *argv[1:]])


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
