"""The test runners' summary parsers, fed output captured from the real runners."""

from __future__ import annotations

from sandboxd.testsuite import PARSERS, Counts, parse_go, parse_jest, parse_pytest

# --------------------------------------------------------------------------- pytest

PYTEST_HEADER = """\
============================= test session starts ==============================
platform linux -- Python 3.11.2, pytest-7.2.1, pluggy-1.0.0+repack
rootdir: /workspace
collected 3 items

tests/test_calc.py .F.                                                   [100%]
"""

PYTEST_FAILED = (
    PYTEST_HEADER
    + """
=================================== FAILURES ===================================
___________________________________ test_sub ___________________________________

    def test_sub():
>       assert 1 - 1 == 1
E       assert (1 - 1) == 1

tests/test_calc.py:6: AssertionError
=========================== short test summary info ============================
FAILED tests/test_calc.py::test_sub - assert (1 - 1) == 1
========================= 1 failed, 2 passed in 0.04s ==========================
"""
)

PYTEST_EVERYTHING = """\
tests/test_a.py ..F.sxXE                                                 [100%]

==================================== ERRORS ====================================
_________________________ ERROR at setup of test_err __________________________
E       RuntimeError
=============================== warnings summary ===============================
tests/test_a.py::test_ok2
  /workspace/tests/test_a.py:3: UserWarning: w1
    warnings.warn("w1")

-- Docs: https://docs.pytest.org/en/stable/how-to/capture-warnings.html
=========================== short test summary info ============================
FAILED tests/test_a.py::test_bad - assert 1 == 2
ERROR tests/test_a.py::test_err - RuntimeError
= 1 failed, 3 passed, 1 skipped, 1 xfailed, 1 xpassed, 2 warnings, 1 error in 0.06s =
"""

PYTEST_NO_TESTS = """\
============================= test session starts ==============================
platform linux -- Python 3.11.2, pytest-7.2.1, pluggy-1.0.0+repack
rootdir: /workspace
collected 0 items

============================ no tests ran in 0.01s =============================
"""

PYTEST_NO_TESTS_DIR = PYTEST_NO_TESTS + "ERROR: file or directory not found: tests\n\n"

PYTEST_COLLECTION_ERROR = """\
collected 0 items / 1 error

==================================== ERRORS ====================================
______________________ ERROR collecting tests/test_b.py _______________________
ImportError while importing test module '/workspace/tests/test_b.py'.
E   ModuleNotFoundError: No module named 'nonexistent_mod'
=========================== short test summary info ============================
ERROR tests/test_b.py
!!!!!!!!!!!!!!!!!!!! Interrupted: 1 error during collection !!!!!!!!!!!!!!!!!!!!
=============================== 1 error in 0.05s ===============================
"""


def _counts(c: Counts) -> tuple[int, int, int, int, bool]:
    return (c.passed, c.failed, c.skipped, c.errors, c.no_tests)


def test_pytest_failed_and_passed() -> None:
    counts = parse_pytest(PYTEST_FAILED, 1)
    assert _counts(counts) == (2, 1, 0, 0, False)
    assert counts.summary == "1 failed, 2 passed in 0.04s"


def test_pytest_all_passed() -> None:
    rule = "=" * 30
    out = f"{PYTEST_HEADER}{rule} 3 passed in 0.02s {rule}=\n"
    counts = parse_pytest(out, 0)
    assert _counts(counts) == (3, 0, 0, 0, False)
    assert counts.summary == "3 passed in 0.02s"


def test_pytest_every_outcome() -> None:
    counts = parse_pytest(PYTEST_EVERYTHING, 1)
    # xpassed counts as passed, xfailed as skipped, warnings as nothing
    assert _counts(counts) == (4, 1, 2, 1, False)
    assert counts.summary == (
        "1 failed, 3 passed, 1 skipped, 1 xfailed, 1 xpassed, 2 warnings, 1 error in 0.06s"
    )


def test_pytest_plural_errors_and_long_duration() -> None:
    out = "====== 2 failed, 5 passed, 3 errors, 1 warning in 65.12s (0:01:05) ======\n"
    counts = parse_pytest(out, 1)
    assert _counts(counts) == (5, 2, 0, 3, False)
    assert counts.summary == "2 failed, 5 passed, 3 errors, 1 warning in 65.12s (0:01:05)"


def test_pytest_collection_error() -> None:
    counts = parse_pytest(PYTEST_COLLECTION_ERROR, 2)
    assert _counts(counts) == (0, 0, 0, 1, False)
    assert counts.summary == "1 error in 0.05s"


def test_pytest_uses_the_last_summary_line() -> None:
    """A test that prints a summary-looking line must not win over pytest's own."""
    out = (
        "tests/test_x.py ============ 9 passed in 1.00s ============\n"
        "===== 7 passed in 9.99s =====\n"
        "======================== 1 failed, 1 passed in 0.10s =========================\n"
    )
    counts = parse_pytest(out, 1)
    assert _counts(counts) == (1, 1, 0, 0, False)


def test_pytest_no_tests_ran_exit_5() -> None:
    counts = parse_pytest(PYTEST_NO_TESTS, 5)
    assert _counts(counts) == (0, 0, 0, 0, True)
    assert counts.summary == "no tests ran in 0.01s"


def test_pytest_exit_5_without_summary_line() -> None:
    counts = parse_pytest("", 5)
    assert counts.no_tests is True
    assert counts.summary == "no tests ran"


def test_pytest_no_tests_folder_exit_4() -> None:
    counts = parse_pytest(PYTEST_NO_TESTS_DIR, 4)
    assert counts.no_tests is True
    assert counts.summary is not None
    assert "tests" in counts.summary
    assert counts.summary != "no tests ran in 0.01s"


def test_pytest_other_usage_error_is_not_no_tests() -> None:
    out = (
        "ERROR: usage: __main__.py [options] [file_or_dir] [file_or_dir] [...]\n"
        "__main__.py: error: unrecognized arguments: --bogus\n"
    )
    counts = parse_pytest(out, 4)
    assert counts.no_tests is False
    assert counts.summary is None


def test_pytest_no_tests_text_with_tests_run_is_not_no_tests() -> None:
    """Exit 0: the phrase in some test's output changes nothing."""
    out = "print: file or directory not found: tests\n===== 1 passed in 0.01s =====\n"
    counts = parse_pytest(out, 0)
    assert _counts(counts) == (1, 0, 0, 0, False)


def test_pytest_killed_runner_has_no_counts() -> None:
    counts = parse_pytest(PYTEST_HEADER, None)
    assert _counts(counts) == (0, 0, 0, 0, False)
    assert counts.summary is None


def test_pytest_quiet_summary_line() -> None:
    out = (
        "..F.sxXE                                                                 [100%]\n"
        "FAILED tests/test_a.py::test_bad - assert 1 == 2\n"
        "1 failed, 2 passed, 1 skipped, 1 xfailed, 1 xpassed, 1 warning, 1 error in 0.02s\n"
    )
    counts = parse_pytest(out, 1)
    assert _counts(counts) == (3, 1, 2, 1, False)


# --------------------------------------------------------------------------- jest

JEST_FAILED = """\
FAIL ./sum.test.js
  ● sum \u203a subtracts

    expect(received).toBe(expected) // Object.is equality

    Expected: 1
    Received: 0

      at Object.toBe (sum.test.js:8:20)

PASS ./other.test.js

Test Suites: 1 failed, 1 passed, 2 total
Tests:       1 failed, 2 passed, 3 total
Snapshots:   0 total
Time:        0.512 s
Ran all test suites.
"""

JEST_SKIPPED = """\
PASS ./sum.test.js

Test Suites: 1 passed, 1 total
Tests:       1 skipped, 2 todo, 4 passed, 7 total
Snapshots:   0 total
Time:        0.3 s
Ran all test suites.
"""

JEST_NO_TESTS = """\
No tests found, exiting with code 1
Run with `--passWithNoTests` to exit with code 0
In /workspace
  2 files checked.
  testMatch: **/__tests__/**/*.[jt]s?(x), **/?(*.)+(spec|test).[tj]s?(x) - 0 matches
  testPathIgnorePatterns: /node_modules/ - 2 matches
  testRegex:  - 0 matches
Pattern:  - 0 matches
"""

JEST_SUITE_BROKEN = """\
FAIL ./sum.test.js
  ● Test suite failed to run

    SyntaxError: /workspace/sum.test.js: Unexpected token (3:10)

Test Suites: 1 failed, 1 total
Tests:       0 total
Snapshots:   0 total
Time:        0.41 s
Ran all test suites.
"""


def test_jest_failed_and_passed() -> None:
    counts = parse_jest(JEST_FAILED, 1)
    assert _counts(counts) == (2, 1, 0, 0, False)
    assert counts.summary == "Tests: 1 failed, 2 passed, 3 total"


def test_jest_does_not_read_the_suites_line() -> None:
    out = "Test Suites: 4 failed, 9 passed, 13 total\nTests:       3 passed, 3 total\n"
    counts = parse_jest(out, 0)
    assert _counts(counts) == (3, 0, 0, 0, False)


def test_jest_skipped_and_todo() -> None:
    counts = parse_jest(JEST_SKIPPED, 0)
    assert _counts(counts) == (4, 0, 3, 0, False)


def test_jest_no_tests_found() -> None:
    counts = parse_jest(JEST_NO_TESTS, 1)
    assert counts.no_tests is True
    assert counts.summary == "No tests found"
    assert _counts(counts) == (0, 0, 0, 0, True)


def test_jest_killed_runner_has_no_counts() -> None:
    counts = parse_jest("PASS ./sum.test.js\n", None)
    assert _counts(counts) == (0, 0, 0, 0, False)
    assert counts.summary is None


def test_jest_suite_that_failed_to_run_counts_as_error() -> None:
    counts = parse_jest(JEST_SUITE_BROKEN, 1)
    assert counts.errors >= 1


# --------------------------------------------------------------------------- go test

# `go test -v ./...` (go1.19): one failing package, one without tests, one passing.
GO_MIXED = """\
=== RUN   TestAdd
--- PASS: TestAdd (0.00s)
=== RUN   TestSub
    calc_test.go:8: expected 1, got 2
--- FAIL: TestSub (0.00s)
=== RUN   TestSkip
    calc_test.go:9: skipping
--- SKIP: TestSkip (0.00s)
=== RUN   TestParent
=== RUN   TestParent/child
--- PASS: TestParent (0.00s)
    --- PASS: TestParent/child (0.00s)
FAIL
FAIL\texample.com/calc\t0.003s
?   \texample.com/calc/cmd\t[no test files]
=== RUN   TestOne
--- PASS: TestOne (0.00s)
PASS
ok  \texample.com/calc/util\t0.003s
FAIL
"""

GO_BUILD_FAILED = """\
# example.com/calc/broken [example.com/calc/broken.test]
broken/b_test.go:3:28: undefined: Foo
=== RUN   TestOne
--- PASS: TestOne (0.00s)
PASS
ok  \texample.com/calc/util\t(cached)
FAIL\texample.com/calc/broken [build failed]
FAIL
"""

GO_NO_TEST_FILES = """\
?   \texample.com/calc\t[no test files]
?   \texample.com/calc/cmd\t[no test files]
"""


def test_go_counts_verdict_lines_and_packages() -> None:
    counts = parse_go(GO_MIXED, 1)
    # subtests count too: TestAdd, TestParent, TestParent/child, TestOne
    assert _counts(counts) == (4, 1, 1, 0, False)
    assert counts.summary == "1 packages ok, 1 failed, 1 without tests"


def test_go_all_ok() -> None:
    out = "=== RUN   TestA\n--- PASS: TestA (0.00s)\nPASS\nok  \texample.com/a\t0.002s\n"
    counts = parse_go(out, 0)
    assert _counts(counts) == (1, 0, 0, 0, False)
    assert counts.summary == "1 packages ok, 0 failed, 0 without tests"


def test_go_build_failed_is_an_error() -> None:
    counts = parse_go(GO_BUILD_FAILED, 2)
    assert _counts(counts) == (1, 0, 0, 1, False)
    assert counts.summary == "1 packages ok, 1 failed, 0 without tests"


def test_go_setup_failed_is_an_error() -> None:
    out = "FAIL\texample.com/a [setup failed]\nFAIL\n"
    assert parse_go(out, 1).errors == 1


def test_go_no_test_files() -> None:
    counts = parse_go(GO_NO_TEST_FILES, 0)
    assert _counts(counts) == (0, 0, 0, 0, True)
    assert counts.summary == "0 packages ok, 0 failed, 2 without tests"


def test_go_no_test_files_beside_tested_package_is_not_no_tests() -> None:
    out = GO_NO_TEST_FILES + "ok  \texample.com/calc/util\t0.001s\n"
    assert parse_go(out, 0).no_tests is False


def test_go_no_packages() -> None:
    out = 'go: warning: "./..." matched no packages\nno packages to test\n'
    counts = parse_go(out, 1)
    assert counts.no_tests is True
    assert counts.summary is None


def test_go_indented_test_output_is_not_a_verdict() -> None:
    """Only `--- PASS:` style lines count, not words in logs."""
    out = "    calc_test.go:8: PASS: looked fine\n    ok example\n--- PASS: TestA (0.00s)\n"
    counts = parse_go(out, 0)
    assert _counts(counts)[:3] == (1, 0, 0)
    assert counts.summary is None


# --------------------------------------------------------------------------- registry


def test_parsers_by_runner_name() -> None:
    assert PARSERS["pytest"] is parse_pytest
    assert PARSERS["jest"] is parse_jest
    assert PARSERS["go test"] is parse_go
