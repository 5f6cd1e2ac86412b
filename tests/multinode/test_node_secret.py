"""Where a node finds the group's node secret (launcher/engine/nodesecret.py): the head writes one
when it has none, every other node refuses to start without one, in one line."""

from __future__ import annotations

import stat
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from launcher.engine import nodesecret
from launcher.engine.nodesecret import SECRET_ENV, NodeSecretError, parse, resolve

GOOD = "f0" * 32


def test_the_head_without_a_secret_writes_a_new_one_only_its_user_can_read(
    tmp_path: Path,
) -> None:
    made = resolve(0, None, {}, tmp_path)
    file = tmp_path / "node-secret"
    assert (made.written, made.where) == (True, str(file))
    assert stat.S_IMODE(file.stat().st_mode) == 0o600
    assert file.read_text().strip().encode() == made.value
    assert len(made.value) == 64
    again = resolve(0, None, {}, tmp_path)  # a restart keeps the group's secret
    assert (again.value, again.written) == (made.value, False)
    assert resolve(1, None, {}, tmp_path).value == made.value  # a node on the same machine


def test_heads_starting_together_end_with_one_secret(tmp_path: Path) -> None:
    got: list[bytes] = []
    threads = [threading.Thread(target=lambda: got.append(resolve(0, None, {}, tmp_path).value))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got)) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["node-secret"]  # no temporary file left


def test_a_node_without_a_secret_refuses_to_start_in_one_line_saying_where(
    tmp_path: Path,
) -> None:
    with pytest.raises(NodeSecretError) as err:
        resolve(1, None, {}, tmp_path)
    (line,) = str(err.value).splitlines()
    assert line.startswith(f"node 1 needs the group's node secret and {tmp_path}/node-secret "
                           "does not exist")
    assert "--node-secret-file" in line
    assert SECRET_ENV in line


def test_the_file_given_wins_over_the_variable_and_the_variable_over_the_default(
    tmp_path: Path,
) -> None:
    given_file = tmp_path / "given"
    given_file.write_text(GOOD + "\n")
    given_file.chmod(0o600)
    env = {SECRET_ENV: "e1" * 32}
    assert resolve(1, given_file, env, tmp_path).value == GOOD.encode()
    assert resolve(1, None, env, tmp_path).value == ("e1" * 32).encode()
    assert not (tmp_path / "node-secret").exists()


def test_a_secret_file_others_can_read_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "s"
    file.write_text(GOOD)
    file.chmod(0o644)
    with pytest.raises(NodeSecretError, match=r"can be read by other users \(mode 644\): run "
                       r"`chmod 600"):
        resolve(1, file, {}, tmp_path)


@pytest.mark.parametrize(("text", "why"), [
    ("", "not one line of printable ASCII"),
    ("short", "has 5 characters"),
    (GOOD + "\n" + GOOD, "not one line"),
    ("é" * 40, "not one line of printable ASCII"),
])  # fmt: skip
def test_a_secret_that_is_empty_short_or_not_one_line_is_refused(text: str, why: str) -> None:
    with pytest.raises(NodeSecretError, match=why):
        parse(text, "here")


@given(st.text(max_size=2000))
def test_any_text_is_a_secret_or_one_line_why(text: str) -> None:
    why: list[str] = []
    try:
        value = parse(text, "here")
    except NodeSecretError as exc:
        why.append(str(exc))
    if why:
        assert len(why[0].splitlines()) == 1
    else:
        assert nodesecret.MIN_CHARS <= len(value) <= nodesecret.MAX_CHARS
        assert value.decode() == text.strip()
