"""The controller's node answering a client of another machine (:mod:`skyward.jobs.remote`):
``python -m skyward.jobs.answer VERB ARG...``, run over SSH in the controller's skyward home.

Each verb does what :mod:`skyward.jobs.client` does with a controller on its own machine (which
this node is: the controller is started here when it is not running) and prints the answer as
its last line, :data:`~skyward.jobs.remote.ANSWER_MARK` then a pickle (base64) of ``("ok",
value)`` or ``("error", exception)``; a followed log is printed before it as it comes. Verbs:

* ``submit NAME RESOURCES CWD`` (the plan pickled on standard input): the new job's id;
* ``list``, ``get ID``: records (:class:`~skyward.jobs.store.JobRecord`);
* ``wait ID TIMEOUT`` (``none``: as long as it takes), ``cancel TIMEOUT NAME ID...`` (``-``:
  no name): records once ended;
* ``logs ID FOLLOW OF_CONTROLLER`` (``0``/``1``): the output, then the record;
* ``outcome ID``: the text of a Python call's kept outcome, or None.
"""

from __future__ import annotations

import base64
import importlib.util
import os
import pickle
import sys
from typing import Any

from skyward.errors import ClusterError, SkywardError
from skyward.jobs import client
from skyward.jobs.remote import ANSWER_MARK, LOCAL, VARIABLE
from skyward.jobs.store import RESULT_FILE

__all__ = ["answer", "main"]


def answer(verb: str, args: list[str]) -> Any:
    """What ``verb`` answers to ``args`` on this node."""
    if verb == "submit":
        if importlib.util.find_spec("paramiko") is None:  # (before the job is recorded, not when it launches)
            raise ClusterError("jobs-controller", "the controller's node has no paramiko, which the controller needs "
                               "to reach the jobs' machines over SSH", way_out="make the controller's cluster with an "
                               "image that installs it (sky.Image(pip=['paramiko'])), or with the SSH provider's "
                               "system_site_packages=['paramiko'] where the host's Python has it")
        return client.record(args[0], args[1], pickle.loads(sys.stdin.buffer.read()), cwd=args[2])
    if verb == "list":
        return client.jobs()
    if verb == "get":
        return client.get(int(args[0]))
    if verb == "wait":
        return client.wait(int(args[0]), None if args[1] == "none" else float(args[1]))
    if verb == "cancel":
        ids = [int(i) for i in args[2:]] or None
        return client.cancel(ids, name=None if args[1] == "-" else args[1], timeout=float(args[0]))
    if verb == "logs":
        return client.logs(int(args[0]), sys.stdout, follow=args[1] == "1", of_controller=args[2] == "1")
    if verb == "outcome":
        kept = client.get(int(args[0])).directory / RESULT_FILE
        return kept.read_text() if kept.exists() else None
    raise ValueError(f"unknown verb {verb!r}")


def main(argv: list[str]) -> int:
    os.environ[VARIABLE] = LOCAL  # (this node's own controller answers, whatever its login sets or the job is)
    try:
        reply: tuple[str, Any] = ("ok", answer(argv[0], argv[1:]))
    except (SkywardError, TimeoutError) as exc:
        reply = ("error", exc)
    except Exception as exc:  # (a bug here: said as an error of the controller, with its type)
        reply = ("error", ClusterError("jobs-controller", f"the controller's node failed: {type(exc).__name__}: {exc}"))
    try:
        data = pickle.dumps(reply)
    except Exception:
        data = pickle.dumps(("error", ClusterError("jobs-controller", str(reply[1]))))
    sys.stdout.flush()
    sys.stdout.write(ANSWER_MARK + base64.b64encode(data).decode() + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
