"""Plan with a kernel table measured on another machine (issue 22): `launcher plan ARGS`, with
TABLE (a `probe --measure --model` record, e.g. from a lent GPU's kernel cache) standing in for
the table this machine would keep under its own key (device, driver, vLLM and torch versions).

    python benchmarks/gpu/plan_with_table.py TABLE.json --model M --topology SAVED ... [-- FLAGS]

The table is used for the shape it was timed for; the rest of the plan is this checkout's.
Where this checkout's step shape for the model differs from the one the table was timed for
(the MLA shapes gained their real projections and attention dims), the ops whose dims are
unchanged keep their times and the rest are marked untimed, so the plan takes the roofline's
figures for them and says so. Agreement with a reading already made, not a prediction made
before it.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from launcher.cli.main import main
from launcher.model.modelspec import load_model_spec
from launcher.planner.kernelcost import step_shape
from launcher.probe import kernelprobe, kernels
from launcher.probe.kernels import KernelTable, StepShape, TableKey


def carried(table: KernelTable, shape: StepShape) -> KernelTable:
    """``table`` for ``shape``: ops of unchanged dims as timed, the others untimed."""
    old = {f"linear:{x.name}": x for x in table.shape.linears}
    changed = {f"linear:{x.name}" for x in shape.linears if old.get(f"linear:{x.name}") != x}
    if table.shape.attention != shape.attention:
        changed |= {"attn:prefill", "attn:decode"}
    gone = set(old) - {f"linear:{x.name}" for x in shape.linears}
    times = tuple(t for t in table.times if t.op.removeprefix("eager:") not in changed | gone)
    return replace(table, shape=shape, times=times,
                   untimed=tuple(sorted(set(table.untimed) | changed)),
                   notes=(*table.notes, f"carried over from a table of an older shape; "
                                        f"untimed here: {', '.join(sorted(changed))}"))


def run(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    table = kernels.table_from_json(json.loads(Path(argv[0]).read_text()))
    model = argv[argv.index("--model") + 1] if "--model" in argv else None
    shape = step_shape(load_model_spec(model)) if model else None

    def kept(cache_dir: Path, key: TableKey) -> tuple[KernelTable | None, str]:
        if key.shape == table.key.shape:
            return replace(table, key=key), ""
        if shape is not None and key.shape == shape.key() and shape.name == table.shape.name:
            return replace(carried(table, shape), key=key), ""
        return None, ""

    kernelprobe.cached_table = kept  # the one seam a plan reads kept tables through
    return main(["plan", *argv[1:]])


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
