"""Managed jobs (SkyPilot's ``sky jobs``): a task run end to end by a controller that is not the
client, on a cluster of its own, recovered when a node is lost, and torn down when it ends.

From Python (``sky.jobs``): :func:`launch` runs a ``@sky.compute`` call as a managed job and
returns a :class:`ManagedJob`; :func:`get` and :func:`list` find them again in any process.

- :mod:`~skyward.jobs.calls`: managed jobs from Python (``sky.jobs.launch``);
- :mod:`~skyward.jobs.store`: the jobs' records (SQLite under the skyward home) and their states;
- :mod:`~skyward.jobs.client`: submit, list, cancel, logs (what ``skyward jobs`` calls);
- :mod:`~skyward.jobs.controller`: the controller process on this machine, its one loop;
- :mod:`~skyward.jobs.watch`: the controller's steps for one job (launch, look, recover, end);
- :mod:`~skyward.jobs.launcher`: one launch of a job's cluster, a process of its own;
- :mod:`~skyward.jobs.remote`, :mod:`~skyward.jobs.answer`: a controller on a cluster's node, asked over SSH;
- :mod:`~skyward.jobs.aws`: that node an on-demand AWS instance, launched on first use, with its permissions.

Built on :mod:`skyward.launch` (a job's cluster is a named cluster that ``launch -c -d`` brings
up) and :mod:`skyward.clusters` (its run is a job in that cluster's queue).
"""

from skyward.jobs.calls import ManagedJob, get, launch
from skyward.jobs.calls import listed as list  # noqa: A001 (``sky.jobs.list()``, as SkyPilot's)

__all__ = ["ManagedJob", "get", "launch", "list"]
