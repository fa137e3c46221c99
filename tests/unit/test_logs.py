"""Log lines: journald priorities, and what the access log may say about a request."""

from __future__ import annotations

import io
import logging
import os
from pathlib import Path

from aiohttp.test_utils import make_mocked_request

from sandboxd import logs


def _record(level: int, message: str) -> logging.LogRecord:
    return logging.LogRecord("sandboxd", level, __file__, 1, message, None, None)


def test_journal_lines_carry_the_syslog_priority_of_their_level():
    fmt = logs.JournalFormatter("%(name)s: %(message)s")
    assert fmt.format(_record(logging.INFO, "hi")) == "<6>sandboxd: hi"
    assert fmt.format(_record(logging.WARNING, "hm")) == "<4>sandboxd: hm"
    assert fmt.format(_record(logging.ERROR, "no")) == "<3>sandboxd: no"
    assert fmt.format(_record(logging.DEBUG, "x")) == "<7>sandboxd: x"
    # Every line of a multi-line message keeps the priority.
    assert fmt.format(_record(logging.ERROR, "a\nb")) == "<3>sandboxd: a\n<3>b"


def test_journal_stream_must_name_the_stream_itself(short_tmp: Path):
    path = short_tmp / "log"
    with open(path, "w") as stream:
        st = os.fstat(stream.fileno())
        assert logs.stderr_is_journal(stream, {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"})
        assert not logs.stderr_is_journal(stream, {"JOURNAL_STREAM": f"{st.st_dev}:1"})
        assert not logs.stderr_is_journal(stream, {"JOURNAL_STREAM": "garbage"})
        assert not logs.stderr_is_journal(stream, {})
    assert not logs.stderr_is_journal(io.StringIO(), {"JOURNAL_STREAM": "1:2"})


def test_plain_lines_carry_a_timestamp_and_level():
    root = logging.getLogger()
    saved = (list(root.handlers), root.level, logging.getLogger("aiohttp").level)
    out = io.StringIO()
    logs.setup("info", out)
    try:
        logging.getLogger("sandboxd.test").info("hello")
        logging.getLogger("sandboxd.test").debug("hidden")
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        logging.getLogger("aiohttp").setLevel(saved[2])
    line = out.getvalue().strip()
    assert line.endswith("INFO sandboxd.test: hello")
    assert line[:4].isdigit()
    assert "hidden" not in out.getvalue()


def test_sandbox_id_is_logged_only_when_plain():
    request = make_mocked_request("GET", "/v1/sandboxes/sb-1", match_info={"id": "sb-1"})
    assert logs.sandbox_of(request) == "sb-1"
    request = make_mocked_request("GET", "/v1/sandboxes/x", match_info={"id": "a\nb"})
    assert logs.sandbox_of(request) == "?"
    request = make_mocked_request("GET", "/v1/status")
    assert logs.sandbox_of(request) == "-"
    request = make_mocked_request("POST", "/v1/sandboxes")
    request[logs.SANDBOX_ID] = "sb-2"
    assert logs.sandbox_of(request) == "sb-2"
