"""benchmarks/gpu/burst_stamps.py, the reader of the stamps issue22-case.sh's STAMPS=1 leaves
(benchmarks/vllm_frontend_order/stamps.py): a burst's requests followed from loadgen's send
through the API server and the engine core to the step that took them in, on a generated record;
and its parser, which a record cut by a killed process must not stop."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.scripts import load_script

BS = load_script("benchmarks/gpu/burst_stamps.py", "burst_stamps_benchmark")

API, CORE, LG = 100, 200, 300


def burst_record(tmp_path: Path, n: int = 16, step_at: float = 10.050) -> Path:
    """n requests sent 0.02 ms apart at t=10 s (perf_counter 5 s behind monotonic), one first
    request scheduled alone, the rest in one step at step_at; plus a failed hook."""
    api: list[list[object]] = [
        [1.0, "patched", "vllm.v1.engine.async_llm"],
        [1.0, "patchfail", "vllm.v1.engine.core_client", "AttributeError('x')"]]
    core: list[list[object]] = [[1.0, "patched", "vllm.v1.core.sched.scheduler"]]
    sends = []
    for k in range(n):
        sent = 10.0 + 2e-5 * k
        arrive = sent + 0.0005 + 0.001 * k  # the loop takes them one by one, 1 ms apart
        rid = f"r{k}"
        sends.append([k, sent - 5.0, 10.2 - 5.0, 11.0 - 5.0])
        api += [[arrive, "app", k, -1, f"x{k}"], [arrive + 1e-4, "add0", k],
                [arrive + 2e-4, "zmq0", k, rid], [arrive + 3e-4, "zmq1", k],
                [10.2, "send1", k]]
        core += [[arrive + 4e-4, "erecv", rid],
                 [10.0015 if k == 0 else step_at - 1e-4, "eadd", rid]]
    core += [[10.003, "sched", 10.002, 512, ["r0"], 1],
             [step_at + 0.001, "sched", step_at, 512 * (n - 1) + 1,
              [f"r{k}" for k in range(1, n)], n]]
    lg = [[12.0, "lgreq", 12.0 - 5.0, ["loadgen", "--json", "/x/c32.json"], sends],
          [13.0, "lgreq", 13.0 - 5.0, ["loadgen", "--json", "/x/single.json"], sends[:1]]]
    for pid, rows in ((API, api), (CORE, core), (LG, lg)):
        (tmp_path / f"ev-{pid}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def test_each_request_is_followed_to_the_step_that_took_it_in(tmp_path: Path) -> None:
    events, bad = BS.load(burst_record(tmp_path))
    assert bad == 0
    rec = BS.build(events)
    lines = BS.report(rec)
    text = "\n".join(lines)
    assert "burst 0: 16 requests, ms from its first loadgen send" in text
    rows = [ln.split() for ln in lines if ln[:3].strip().isdigit()]
    assert len(rows) == 16
    # request 0: sent at 0, in at 0.5 ms, scheduled alone in step 0 at 2 ms, first token at 200 ms
    assert rows[0] == ["0", "0.0", "0.5", "0.6", "0.8", "0.9", "1.5", "0@2.0", "200.0", "200.0"]
    # the last: sent at 0.3 ms (loadgen, rank-matched), in at 15.8 ms, in step 1 at 50 ms
    assert rows[15][:3] == ["15", "0.3", "15.8"]
    assert rows[15][7] == "1@50.0"
    assert "1@50.0:7681t/15new/16" in text
    # the 15 of the big step: spread over 14 ms at every stage until the busy loop adds them
    assert "step 1's 15: app 1.5..15.8  zmq1 1.8..16.1  recv 1.9..16.2  eadd 49.9..49.9" in text
    assert any("patchfail" in ln and "core_client" in ln for ln in lines)


def test_a_burst_without_its_loadgen_record_is_timed_from_its_first_arrival(tmp_path: Path) -> None:
    burst_record(tmp_path)
    (tmp_path / f"ev-{LG}.jsonl").unlink()
    text = "\n".join(BS.report(BS.build(BS.load(tmp_path)[0])))
    assert "ms from its first arrival (no loadgen match)" in text


def test_groups_smaller_than_the_least_burst_are_left_out(tmp_path: Path) -> None:
    burst_record(tmp_path, n=4)
    text = "\n".join(BS.report(BS.build(BS.load(tmp_path)[0]), min_size=8))
    assert "burst 0" not in text
    assert "(1 groups of fewer than 8 arrivals left out)" in text


def test_a_cut_last_line_is_skipped_and_counted(tmp_path: Path) -> None:
    burst_record(tmp_path)
    with (tmp_path / f"ev-{CORE}.jsonl").open("a") as f:
        f.write('[10.9, "sched", 10.8, 5')  # the process killed mid-write
    events, bad = BS.load(tmp_path)
    assert bad == 1
    assert "burst 0: 16 requests" in "\n".join(BS.report(BS.build(events)))


_row = st.lists(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                          st.text(max_size=5), st.lists(st.text(max_size=3), max_size=3)),
                max_size=6)
_line = st.one_of(st.text(max_size=40), _row.map(json.dumps),
                  st.tuples(st.floats(allow_nan=False, allow_infinity=False),
                            st.sampled_from(["app", "zmq0", "sched", "eadd", "erecv", "lgreq",
                                             "send1", "gate", "patchfail"]), _row)
                  .map(lambda r: json.dumps([r[0], r[1], *r[2]])))


@settings(max_examples=300, deadline=None)
@given(st.lists(_line, max_size=30))
def test_any_lines_are_read_and_reported_without_an_exception(lines: list[str]) -> None:
    events, bad = BS.parse_lines(lines, pid=7)
    assert len(events) + bad <= len(lines)
    assert all(isinstance(e.t, float) and isinstance(e.name, str) for e in events)
    BS.report(BS.build(sorted(events, key=lambda e: e.t)), min_size=1)


STAMPS = Path(__file__).resolve().parents[2] / "benchmarks" / "vllm_frontend_order" / "stamps.py"

_GATED = """
import sys, time, types
sys.modules.setdefault("vllm", types.ModuleType("vllm"))  # a vLLM process, as far as it asks
import sitecustomize as s
s.note("patched", "x")
s.ev("before")
open(sys.argv[1], "w").close()
time.sleep(0.5)
s.ev("during")
time.sleep(1.5)
assert not list(__import__("pathlib").Path(sys.argv[3]).glob("ev-*.jsonl")), "written while open"
open(sys.argv[2], "w").close()
time.sleep(0.5)
s.ev("after")
print(open(f"{sys.argv[3]}/ev-{__import__('os').getpid()}.jsonl").read())
"""


def test_stamps_keep_rows_only_while_the_gate_is_open_and_write_them_as_it_shuts(
        tmp_path: Path) -> None:
    """STAMPS=1's gate (c32's gpu-metrics.txt to its c32.json): nothing written beside the
    measured run, everything written before the serving can be stopped."""
    sc = tmp_path / "sc"
    sc.mkdir()
    shutil.copy(STAMPS, sc / "sitecustomize.py")
    ev = tmp_path / "ev"
    start, stop = tmp_path / "start", tmp_path / "stop"
    env = {**os.environ, "PYTHONPATH": str(sc), "H75_EV": str(ev),
           "H75_GATE": f"{start}:{stop}"}
    out = subprocess.run([sys.executable, "-c", _GATED, str(start), str(stop), str(ev)],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    names = [json.loads(line)[1:] for line in out.stdout.splitlines() if line.strip()]
    assert names == [["patched", "x"], ["gate", True], ["during"], ["gate", False]]
