"""The tests that deliver Ctrl-C set up the signal state they assume: they pass when the suite
itself starts with SIGINT ignored (a background job of a non-interactive shell, some CI
runners), where the pool rightly leaves an ignored SIGINT alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CTRL_C_TESTS = (
    "tests/test_lifecycle.py::test_ctrl_c_in_block_leaves_no_worker",
    "tests/contract/test_cancellation.py::test_ctrl_c_while_blocked_in_rshift_raises_and_the_pool_stays_usable[local]",
    "tests/contract/test_cancellation.py::test_ctrl_c_landing_anywhere_in_large_replies_never_tears_the_stream[local]",
    "tests/contract/test_lifecycle.py::test_closing_the_pool_puts_back_the_signal_handlers_it_found[local]",
)


def ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_the_ctrl_c_tests_pass_in_a_suite_started_with_sigint_ignored() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *CTRL_C_TESTS],
        cwd=ROOT, capture_output=True, text=True, timeout=300, preexec_fn=ignore_sigint,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert f"{len(CTRL_C_TESTS)} passed" in proc.stdout
