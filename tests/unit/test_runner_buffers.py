"""runner.TailBuffer and runner.Capture: bounded tails of a process's output."""

from __future__ import annotations

import random

import pytest

from sandboxd.runner import Capture, TailBuffer


def _fed(limit: int, *chunks: bytes) -> TailBuffer:
    buf = TailBuffer(limit)
    for chunk in chunks:
        buf.feed(chunk)
    return buf


# --------------------------------------------------------------------------- TailBuffer


def test_empty_buffer() -> None:
    buf = TailBuffer(8)
    assert buf.getvalue() == b""
    assert buf.text() == ""
    assert buf.dropped is False


def test_under_the_limit_keeps_everything() -> None:
    buf = _fed(10, b"abc", b"def")
    assert buf.getvalue() == b"abcdef"
    assert buf.dropped is False


def test_filling_to_exactly_the_limit_in_pieces_drops_nothing() -> None:
    buf = _fed(6, b"abc", b"def")
    assert buf.getvalue() == b"abcdef"
    assert buf.dropped is False


def test_one_chunk_of_exactly_the_limit_into_empty_buffer_drops_nothing() -> None:
    buf = _fed(4, b"abcd")
    assert buf.getvalue() == b"abcd"
    assert buf.dropped is False


def test_empty_chunks_then_exact_chunk_drops_nothing() -> None:
    buf = _fed(4, b"", b"", b"abcd", b"")
    assert buf.getvalue() == b"abcd"
    assert buf.dropped is False


def test_exact_limit_chunk_after_other_data_drops() -> None:
    buf = _fed(4, b"x", b"abcd")
    assert buf.getvalue() == b"abcd"
    assert buf.dropped is True


def test_one_chunk_over_the_limit_keeps_its_tail() -> None:
    buf = _fed(4, b"abcdefg")
    assert buf.getvalue() == b"defg"
    assert buf.dropped is True


def test_one_byte_over_in_pieces() -> None:
    buf = _fed(4, b"ab", b"cd", b"e")
    assert buf.getvalue() == b"bcde"
    assert buf.dropped is True


def test_trim_splits_the_oldest_chunk() -> None:
    buf = _fed(5, b"abc", b"def", b"gh")
    assert buf.getvalue() == b"defgh"
    buf.feed(b"i")
    assert buf.getvalue() == b"efghi"
    assert buf.dropped is True


def test_dropped_stays_set() -> None:
    buf = _fed(3, b"abcd")
    assert buf.dropped is True
    buf.feed(b"x")
    assert buf.getvalue() == b"cdx"
    assert buf.dropped is True


@pytest.mark.parametrize("seed", range(20))
def test_keeps_exactly_the_last_n_bytes(seed: int) -> None:
    """Against a reference: whatever the chunking, the tail and the flag are exact."""
    rng = random.Random(seed)
    limit = rng.randint(1, 64)
    buf = TailBuffer(limit)
    everything = b""
    for _ in range(rng.randint(0, 40)):
        size = rng.choice(
            [0, 1, rng.randint(1, limit), limit, limit + 1, rng.randint(1, 3 * limit)]
        )
        chunk = rng.randbytes(size)
        buf.feed(chunk)
        everything += chunk
        assert buf.getvalue() == everything[-limit:]
        assert buf.dropped is (len(everything) > limit)


def test_text_decodes_with_replacement() -> None:
    buf = _fed(16, "héllo ".encode(), b"\xff", b" ok")
    assert buf.text() == "héllo \ufffd ok"


def test_tail_may_start_in_a_multibyte_character() -> None:
    buf = _fed(3, "aé".encode() + b"bc")  # a, c3 a9, b, c: the tail begins mid-character
    assert buf.getvalue() == b"\xa9bc"
    assert buf.text() == "\ufffdbc"


# --------------------------------------------------------------------------- Capture


def _capture(limit: int = 8) -> Capture:
    return Capture(
        limit,
        {
            "stdout": "command",
            "stderr": "command",
            "runner_stdout": "runner",
            "runner_stderr": "runner",
            "ctl": None,
        },
    )


def test_capture_groups_interleave_in_feed_order() -> None:
    cap = _capture(limit=100)
    cap.feed("stdout", b"1")
    cap.feed("stderr", b"2")
    cap.feed("runner_stdout", b"R1")
    cap.feed("stdout", b"3")
    cap.feed("ctl", b"runner-start\n")
    cap.feed("runner_stderr", b"R2")
    cap.feed("stderr", b"4")
    assert cap.streams["stdout"].getvalue() == b"13"
    assert cap.streams["stderr"].getvalue() == b"24"
    assert cap.groups["command"].getvalue() == b"1234"
    assert cap.groups["runner"].getvalue() == b"R1R2"
    assert cap.streams["ctl"].getvalue() == b"runner-start\n"
    assert set(cap.groups) == {"command", "runner"}
    assert cap.truncated is False


def test_capture_group_keeps_twice_the_limit() -> None:
    cap = _capture(limit=4)
    cap.feed("stdout", b"abcd")
    cap.feed("stderr", b"efgh")
    assert cap.groups["command"].getvalue() == b"abcdefgh"
    assert cap.truncated is False
    cap.feed("stdout", b"i")
    assert cap.groups["command"].getvalue() == b"bcdefghi"
    assert cap.streams["stdout"].getvalue() == b"bcdi"
    assert cap.truncated is True


def test_capture_truncated_by_a_stream() -> None:
    cap = _capture(limit=4)
    cap.feed("stderr", b"12345")
    assert cap.streams["stderr"].dropped is True
    assert cap.groups["command"].dropped is False
    assert cap.truncated is True


def test_capture_truncated_by_a_stream_outside_any_group() -> None:
    cap = _capture(limit=4)
    cap.feed("ctl", b"12345")
    assert cap.truncated is True


def test_capture_truncated_by_a_group_alone() -> None:
    """Three streams in one group: each fits its own tail, the group's 2x tail does not."""
    cap = Capture(4, {"a": "g", "b": "g", "c": "g"})
    for name in ("a", "b", "c"):
        cap.feed(name, name.encode() * 4)
    assert not any(b.dropped for b in cap.streams.values())
    assert cap.groups["g"].getvalue() == b"bbbbcccc"
    assert cap.truncated is True


def test_capture_exact_limits_are_not_truncated() -> None:
    cap = _capture(limit=4)
    for name in ("stdout", "stderr", "runner_stdout", "runner_stderr", "ctl"):
        cap.feed(name, b"wxyz")
    assert cap.truncated is False


def test_capture_unknown_stream_is_an_error() -> None:
    with pytest.raises(KeyError):
        _capture().feed("nope", b"x")
