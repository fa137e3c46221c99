"""Test mode: the in-sandbox supervisor script and the runners' summary parsers.

The command and the test runner must share one sandbox instance (so tests
can reach a server the command started on 127.0.0.1), so both run under a
small POSIX sh supervisor inside one bwrap. It starts the command in the
background, waits up to the fixed delay (ending early once the command and
everything it started have exited), runs the runner with its output on
separate descriptors, reports both exit codes on a control descriptor, and
exits. bwrap's init then exits too, and the kernel kills whatever the
command left running.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Run by bash (dash cannot name descriptors above 9). Arguments: $1 the
# command, $2 the wait in microseconds, $3 runner-stdout fd, $4 runner-stderr
# fd, $5 control fd, then the runner's argv. The command does not inherit the
# three descriptors. "Alive" means any process but ours and bwrap's init
# (PID 1) that is not a zombie; only builtins run while looking, so the check
# sees no processes of its own.
SUPERVISOR = r"""
cmd=$1 wait_us=$2 rout=$3 rerr=$4 ctl=$5
shift 5
/bin/sh -c "$cmd" <&0 {rout}>&- {rerr}>&- {ctl}>&- &
pid=$!
others_alive() {
  local p n line
  for p in /proc/[0-9]*; do
    n=${p#/proc/}
    [ "$n" = 1 ] && continue
    [ "$n" = $$ ] && continue
    read -r line 2>/dev/null < "$p/stat" || continue
    case "${line##*) }" in Z*) continue;; esac
    return 0
  done
  return 1
}
# The wait is measured on the clock (bash's EPOCHREALTIME), not counted in
# polls, so it is the spec's 2 s and not 2 s plus the cost of each poll.
deadline=$(( ${EPOCHREALTIME/./} + wait_us ))
# Short polls first: a command that is already done is noticed within a few ms.
i=0
while [ "${EPOCHREALTIME/./}" -lt "$deadline" ] && others_alive; do
  if [ "$i" -lt 20 ]; then sleep 0.005; else sleep 0.05; fi
  i=$((i + 1))
done
echo "runner-start" >&"$ctl"
"$@" </dev/null >&"$rout" 2>&"$rerr" {ctl}>&-
rc=$?
echo "runner-exit $rc" >&"$ctl"
read -r state 2>/dev/null < "/proc/$pid/stat"
case "${state##*) }" in
  ""|Z*) wait "$pid"; echo "command-exit $?" >&"$ctl";;
  *) echo "command-running" >&"$ctl";;
esac
exit "$rc"
"""


@dataclass
class Counts:
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    errors: int = 0
    no_tests: bool = False
    summary: str | None = None


# The closing line, with "=" rules or (under -q) without them.
_PYTEST_SUMMARY = re.compile(
    r"^(?:=+ )?((?:\d+ \w+|no tests ran)(?:, \d+ \w+)*) in [\d.]+s(?: \([^)]*\))?(?: =+)?$"
)
_PYTEST_COUNT = re.compile(
    r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected|warnings?)"
)


def parse_pytest(output: str, exit_code: int | None) -> Counts:
    counts = Counts()
    for line in reversed(output.splitlines()):
        match = _PYTEST_SUMMARY.match(line.strip())
        if match:
            counts.summary = line.strip("= ").strip()
            for number, word in _PYTEST_COUNT.findall(match.group(1)):
                n = int(number)
                if word == "passed" or word == "xpassed":
                    counts.passed += n
                elif word == "failed":
                    counts.failed += n
                elif word in ("skipped", "xfailed"):
                    counts.skipped += n
                elif word.startswith("error"):
                    counts.errors += n
            break
    if exit_code == 5:
        counts.no_tests = True
        counts.summary = counts.summary or "no tests ran"
    elif exit_code == 4 and "file or directory not found: tests" in output:
        counts.no_tests = True
        counts.summary = "no tests/ folder in the workspace (pytest looks for tests there)"
    return counts


_JEST_TESTS = re.compile(r"^Tests:\s+(.*)$", re.MULTILINE)
_JEST_COUNT = re.compile(r"(\d+) (passed|failed|skipped|todo|total)")


def parse_jest(output: str, exit_code: int | None) -> Counts:
    counts = Counts()
    found = _JEST_TESTS.findall(output)
    if found:
        line = found[-1].strip()
        counts.summary = f"Tests: {line}"
        for number, word in _JEST_COUNT.findall(line):
            n = int(number)
            if word == "passed":
                counts.passed = n
            elif word == "failed":
                counts.failed = n
            elif word in ("skipped", "todo"):
                counts.skipped += n
    # A suite that could not even load (syntax error, bad import) has no tests
    # to count, but it is a failure: count it as an error, as pytest and go do.
    counts.errors += output.count("Test suite failed to run")
    if "No tests found" in output:
        counts.no_tests = True
        counts.summary = counts.summary or "No tests found"
    return counts


_GO_EVENT = re.compile(r"^\s*--- (PASS|FAIL|SKIP): ", re.MULTILINE)
_GO_PACKAGE = re.compile(r"^(ok|FAIL|\?)[ \t]+(\S+)", re.MULTILINE)


def parse_go(output: str, exit_code: int | None) -> Counts:
    """Counts from go test -v style ``--- PASS`` lines and per-package lines."""
    counts = Counts()
    for verdict in _GO_EVENT.findall(output):
        if verdict == "PASS":
            counts.passed += 1
        elif verdict == "FAIL":
            counts.failed += 1
        else:
            counts.skipped += 1
    packages = _GO_PACKAGE.findall(output)
    tested = [p for p in packages if p[0] != "?"]
    if packages:
        ok = sum(1 for p in packages if p[0] == "ok")
        failed = sum(1 for p in packages if p[0] == "FAIL")
        counts.summary = (
            f"{ok} packages ok, {failed} failed, {len(packages) - len(tested)} without tests"
        )
    if ("no test files" in output and not tested) or "no packages to test" in output:
        counts.no_tests = True
    if "[build failed]" in output or "[setup failed]" in output:
        counts.errors += 1
    return counts


PARSERS = {"pytest": parse_pytest, "jest": parse_jest, "go test": parse_go}
