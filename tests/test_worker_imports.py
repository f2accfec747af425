"""What a starting worker imports: every host of a pool pays it in CPU before its worker says READY.

A worker's interpreter imports ``skyward.worker.agent`` and nothing it does not need before its
first task: cloudpickle (and the logging, platform and inspect it brings) loads when a payload
sent by value needs it, and a named cluster's machinery (sockets, subprocesses, the node's
load probe) only in a named cluster's worker. Each of these is a real interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys

#: Not loaded by a pool's worker before its first task.
LATER = ("cloudpickle", "skyward.worker.resident", "skyward.runtime.jobqueue", "skyward.runtime.nodelook",
         "subprocess", "socket", "logging")


def loaded(code: str) -> set[str]:
    done = subprocess.run([sys.executable, "-c", f"{code}\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_the_worker_agent_loads_none_of_what_its_first_task_may_need() -> None:
    assert sorted(set(LATER) & loaded("import skyward.worker.agent")) == []


def test_a_function_sent_by_value_still_loads_on_a_worker_without_cloudpickle_imported() -> None:
    code = ("import pickle, sys\n"
            "from skyward.protocol import dumps_by_value\n"
            "from skyward.worker.executors import base\n"
            "blob = dumps_by_value(lambda x: x + 1)\n"
            "for name in [m for m in sys.modules if m.startswith('cloudpickle')]:\n"
            "    del sys.modules[name]\n"
            "print(base.resolve_function(blob)(41))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "42\n"), done.stderr
