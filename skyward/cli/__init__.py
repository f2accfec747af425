"""The ``skyward`` command (``skyward = skyward.cli:run``): the top layer, which may import
every other; nothing in the package imports it.

- :mod:`~skyward.cli.main`: the parser, ``launch``/``exec``, the AWS resource commands;
- :mod:`~skyward.cli.clusters`: ``status``, ``start``, ``stop``, ``down``, ``logs`` on named
  clusters;
- :mod:`~skyward.cli.managed`: ``jobs launch``, ``jobs queue``, ``jobs logs``, ``jobs cancel``
  (managed jobs, :mod:`skyward.jobs`).

``skyward --help`` and ``status`` import no paramiko, boto3, pydantic or torch: each command
imports what it needs when it runs.

The program (:func:`run`) ends as soon as its command has returned: its output flushed and the
``atexit`` handlers run (a pool left open is still closed by its own, the live view still gives
the terminal back, log handlers are closed), the process exits without the rest of the
interpreter's teardown (every module's objects freed one by one: ~30 ms after ``skyward exec
NAME true``, measured on the test hosts), unless a thread that is not a daemon still runs (then
it is waited for, as Python does).
"""

from __future__ import annotations

from typing import NoReturn

from skyward.cli.main import main

__all__ = ["end", "main", "run"]


def run() -> NoReturn:
    """The ``skyward`` program: :func:`main` on ``sys.argv``, then :func:`end`."""
    end(main())


def end(code: int) -> NoReturn:
    """End the process with exit status ``code`` now (see the module docstring)."""
    import atexit
    import contextlib
    import os
    import sys
    import threading

    here = threading.current_thread()
    if any(t is not here and not t.daemon and t.is_alive() for t in threading.enumerate()):
        sys.exit(code)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):  # (a closed pipe: the interpreter says so on its way out, as before)
        sys.exit(code)
    atexit._run_exitfuncs()  # (what Python runs first on its way out; the rest is skipped)
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)
