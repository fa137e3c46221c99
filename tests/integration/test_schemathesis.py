"""Schemathesis against a live daemon, from the daemon's own OpenAPI document.

Property-based requests for every operation (the document's examples,
boundary values, random data): no response may be a 5xx, and every response
must conform to the document (status code, content type, schema).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import uid_range_for_test

CHECKS = ",".join(
    (
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_schema_conformance",
    )
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_schemathesis_finds_no_failure(short_tmp: Path):
    port = _free_port()
    config = short_tmp / "config.toml"
    (short_tmp / "conf").mkdir()
    start, count = uid_range_for_test()
    config.write_text(
        f"sandbox_uid_start = {start}\nsandbox_uid_count = {count}\n"
        f'[listen]\ntoken_file = "{short_tmp / "conf" / "token"}"\n'
        "[limits]\nexec_timeout_default = 5.0\nexec_timeout_max = 5.0\n"
    )
    log = open(short_tmp / "daemon.log", "wb")  # noqa: SIM115 - the daemon's lifetime
    daemon = subprocess.Popen(
        [sys.executable, "-m", "sandboxd", "--socket", str(short_tmp / "run" / "s.sock"),
         "--data-dir", str(short_tmp / "data"), "--config", str(config),
         "serve", "--tcp", f"127.0.0.1:{port}"],
        stdout=log, stderr=log, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        token_file = short_tmp / "conf" / "token"
        deadline = time.monotonic() + 30
        while not token_file.exists() or not _listening(port):
            assert daemon.poll() is None, (short_tmp / "daemon.log").read_text()
            assert time.monotonic() < deadline, "daemon did not come up"
            time.sleep(0.1)
        token = token_file.read_text().strip()
        schemathesis = Path(sys.executable).with_name("schemathesis")
        result = subprocess.run(
            [str(schemathesis), "run", f"http://127.0.0.1:{port}/v1/openapi.json",
             "-H", f"Authorization: Bearer {token}", "--checks", CHECKS,
             "--max-examples", os.environ.get("SANDBOXD_FUZZ_EXAMPLES", "25"),
             "--seed", "1"],
            capture_output=True, text=True, timeout=900, cwd=short_tmp,
        )  # fmt: skip
        out = result.stdout
        failures = out[out.find("FAILURES") :] if "FAILURES" in out else out[-3000:]
        print(out[-3000:])
        assert result.returncode == 0, failures[:8000]
        assert " generated" in result.stdout
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
        log.close()


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0
