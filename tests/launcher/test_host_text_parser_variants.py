"""Text the host's own tools print, fed generated variants: NCCL_DEBUG=INFO logs (the channel
lines `launcher probe --measure` classifies a GPU pair's transport by), `lspci -vvv` (ACS
redirects), and the /proc and /sys files `launcher doctor` reads (any bytes: a kernel command
line that is not UTF-8 was a UnicodeDecodeError traceback). Each is read or gives "unknown";
never an exception."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.doctor.checks import parse_lspci_acs, read_host_facts
from launcher.probe.measure import classify, parse_nccl_log

TRANSPORTS = st.sampled_from(["P2P/CUMEM/read", "P2P/IPC", "SHM/direct/direct", "NET/Socket/0",
                              "NVLS", "COLLNET/x", "P2P/direct pointer", "x"])


@st.composite
def channel_line(draw: st.DrawFn) -> tuple[str, tuple[int, int, str]]:
    a, b = draw(st.integers(0, 70)), draw(st.integers(0, 70))
    via = draw(TRANSPORTS)
    side = draw(st.sampled_from(["", " [send]", " [receive]"]))
    ch = draw(st.sampled_from(["00", "01/0", "3/02"]))
    line = f"host:1:2 [0] NCCL INFO Channel {ch} : {a}[{a:x}000] -> {b}[{b:x}000]{side} via {via}"
    return line, (a, b, via)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(channel_line(), st.text(max_size=60).map(lambda t: (t, None))),
                max_size=8),
       st.one_of(st.none(), st.sampled_from(["2.21.5+cuda12.4", "x", ""])))
def test_any_nccl_log_reads_its_channels_and_classifies(
        lines: list[tuple[str, tuple[int, int, str] | None]], version: str | None) -> None:
    text = "\n".join(t for t, _ in lines)
    if version is not None:
        text = f"NCCL INFO NCCL version {version}\n{text}"
    log = parse_nccl_log(text)
    for _, conn in lines:
        if conn is not None:
            assert conn in log.connections  # every well-formed channel line is read
    for nvlinks in (0, 4):
        assert classify(log, nvlinks) in (None, "net", "shm", "nvlink", "p2p-pcie")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(
    st.text(max_size=40),
    st.sampled_from(["00:01.0 PCI bridge: X", "\t\tACSCtl:\tSrcValid+ ReqRedir+ CmpltRedir-",
                     "\t\tACSCtl:\tReqRedir- CmpltRedir+", "\tACSCap: ReqRedir+", ""]),
), max_size=8))
def test_any_lspci_text_gives_the_bridges_that_redirect(lines: list[str]) -> None:
    text = "\n".join(lines)
    got = parse_lspci_acs(text)
    blocks = text.split("\n")
    assert all(isinstance(b, str) and " " not in b for b in got)
    assert len(got) <= sum("ACSCtl:" in line for line in blocks)


@settings(max_examples=60, deadline=None)
@given(cmdline=st.binary(max_size=40), governor=st.binary(max_size=12))
def test_any_proc_and_sys_bytes_are_host_facts(cmdline: bytes, governor: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        (root / "proc").mkdir()
        (root / "proc/cmdline").write_bytes(cmdline)
        gov = root / "sys/devices/system/cpu/cpu0/cpufreq"
        gov.mkdir(parents=True)
        (gov / "scaling_governor").write_bytes(governor)
        facts = read_host_facts(root)
    assert len(facts.governors) == 1
    assert isinstance(facts.kernel_cmdline, str)
