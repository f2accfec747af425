"""``skyward jobs``: managed jobs (SkyPilot's ``sky jobs``), run by a controller, not the client::

    skyward jobs launch TASK.yaml [-n NAME] [--env K=V]... [-d] [-y]   submit; follow its logs unless -d
    skyward jobs queue [--json]                                          every managed job
    skyward jobs logs ID [--controller] [--no-follow]                    its run's output (or the controller's)
    skyward jobs cancel ID... | -n NAME | --all [-y]                     cancel; its cluster torn down

``launch`` prints ``Managed job ID: N`` as soon as the job is recorded: the client may exit
then. ``logs`` (and ``launch`` without ``-d``) exit as the job ended: 0 succeeded, 100 failed,
103 cancelled, 101 not finished.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import IO

__all__ = ["add_commands", "run_command"]

_COLUMNS = ("ID", "NAME", "RESOURCES", "SUBMITTED", "TOT. DURATION", "JOB DURATION", "#RECOVERIES", "STATUS")


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``jobs`` (and its own commands) to the ``skyward`` parser."""
    from skyward.cli.clusters import add_task_flags

    jobs = commands.add_parser("jobs", help="managed jobs: run by a controller on clusters of their own, recovered "
                                            "when a node is lost, torn down when they end")
    sub = jobs.add_subparsers(dest="jobs_command", metavar="COMMAND", required=True)
    launch = sub.add_parser("launch", help="submit a task file as a managed job",
                            description="Submit TASK.yaml as a managed job: the controller brings up a cluster for "
                                        "it, runs setup and run, recovers lost nodes and tears the cluster down at "
                                        "the end. The job goes on whatever becomes of this command.")
    launch.add_argument("entrypoint", nargs=1, metavar="TASK.yaml", help="the task file")
    add_task_flags(launch)
    launch.add_argument("-d", "--detach-run", action="store_true", help="return once the job is submitted")
    launch.add_argument("--yes", "-y", action="store_true", help="do not ask before renting machines")

    queue = sub.add_parser("queue", help="list the managed jobs")
    queue.add_argument("--json", action="store_true", help="print JSON instead of a table")

    logs = sub.add_parser("logs", help="a managed job's output")
    logs.add_argument("id", type=int, metavar="ID")
    logs.add_argument("--controller", action="store_true", help="the controller's log of the job instead")
    logs.add_argument("--no-follow", action="store_true", help="print what is there and return")

    cancel = sub.add_parser("cancel", help="cancel managed jobs (their clusters torn down)")
    cancel.add_argument("ids", nargs="*", type=int, metavar="ID")
    cancel.add_argument("-n", "--name", help="the unfinished jobs of this name")
    cancel.add_argument("-a", "--all", action="store_true", help="every unfinished managed job")
    cancel.add_argument("--yes", "-y", action="store_true", help="do not ask (when on a terminal)")


def run_command(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    """Run ``skyward jobs ...`` (errors are the caller's to report)."""
    if args.jobs_command == "launch":
        return _launch(args, out, err)
    if args.jobs_command == "queue":
        return _queue(args, out)
    if args.jobs_command == "logs":
        return _logs(args.id, out, err, follow=not args.no_follow, of_controller=args.controller)
    return _cancel(args, out, err)


def _launch(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:

    from skyward.cli.clusters import task_plan
    from skyward.errors import ConfigError
    from skyward.jobs import client

    try:
        args.cluster = None
        p = task_plan(args, args.num_nodes)
        if args.task_file is None:
            raise ConfigError("TASK.yaml", "a task file (a managed job runs a task file)", args.entrypoint[0])
    except ConfigError as exc:
        err.write(f"skyward: error: {exc}\n")
        return 2
    out.write(p.describe() + "\n")
    if p.provider != "local" and not args.yes and sys.stdin.isatty():
        if input(f"launch managed job {p.name} on {p.provider}? [Y/n] ").strip().lower() not in ("", "y", "yes"):
            out.write("nothing launched\n")
            return 1
    job = client.submit(p)
    out.write(f"Managed job ID: {job}\n")
    out.flush()
    if args.detach_run:
        err.write(f"skyward: managed job {job} goes on under its controller; `skyward jobs logs {job}` follows it, "
                  f"`skyward jobs queue` lists it\n")
        return 0
    return _logs(job, out, err, follow=True, of_controller=False)


def _queue(args: argparse.Namespace, out: IO[str]) -> int:
    from skyward.jobs import client

    found = client.jobs()
    if args.json:
        json.dump([j.as_dict() for j in found], out, indent=2)
        out.write("\n")
        return 0
    out.write("Managed jobs\n")
    if not found:
        out.write("No managed jobs.\n")
        return 0
    rows = [list(_COLUMNS)] + [[str(j.id), j.name, j.resources, _ago(j.submitted), _duration(j.total_duration),
                                _duration(j.job_duration) if j.started else "-", str(j.recoveries), j.status]
                               for j in reversed(found)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS))]
    for row in rows:
        out.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n")
    return 0


def _ago(when: float) -> str:
    seconds = max(0, int(time.time() - when))
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if seconds >= size:
            return f"{seconds // size} {unit} ago"
    return f"{seconds} s ago"


def _duration(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h {s % 3600 // 60}m {s % 60}s" if s >= 3600 else f"{s // 60}m {s % 60}s" if s >= 60 else f"{s}s"


def _logs(job_id: int, out: IO[str], err: IO[str], *, follow: bool, of_controller: bool) -> int:
    from skyward.jobs import client
    from skyward.jobs.store import FINAL

    try:
        job = client.logs(job_id, out, follow=follow, of_controller=of_controller)
    except KeyboardInterrupt:
        err.write(f"skyward: stopped following managed job {job_id}; it goes on (`skyward jobs cancel {job_id}` "
                  "ends it)\n")
        return 130
    if job.status in FINAL:
        err.write(f"skyward: managed job {job.id}: {job.status}"
                  + (f" ({job.reason})" if job.reason and job.status != "CANCELLED" else "") + "\n")
    return client.exit_status(job)


def _cancel(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    from skyward.errors import ConfigError
    from skyward.jobs import client

    given = sum([bool(args.ids), args.name is not None, args.all])
    if given != 1:
        raise ConfigError("ID", "job ids, -n NAME or --all (one of them)", args.ids or "none of them")
    what = ("every unfinished managed job" if args.all else f"the managed jobs named {args.name}" if args.name
            else "managed job(s) " + ", ".join(map(str, args.ids)))
    if not args.yes and sys.stdin.isatty():
        if input(f"cancel {what}? [y/N] ").strip().lower() not in ("y", "yes"):
            out.write("nothing cancelled\n")
            return 1
    ended = client.cancel(args.ids or None, name=args.name)
    if not ended:
        out.write("no managed job to cancel\n")
    for job in ended:
        out.write(f"managed job {job.id} {job.status}" + ("" if job.cleaned else
                  f" (its cluster {job.cluster} is not yet confirmed down: the controller keeps trying)") + "\n")
    return 0 if all(j.status == "CANCELLED" for j in ended) else 1
