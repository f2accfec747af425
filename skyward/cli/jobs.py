"""The job commands of ``skyward`` (SkyPilot's job queue on a cluster)::

    skyward queue [NAME...] [-a] [--json]              the clusters' jobs (recent ones without -a)
    skyward cancel NAME [ID...] [--all] [-y]           end jobs on every node, then CANCELLED
    skyward logs NAME [ID] [--no-follow] [--status] [--tail N] [--sync-down]   a job's output (the latest job)

``logs --status`` prints the job's state and exits with SkyPilot's codes: 0 succeeded, 100
failed, 101 not finished, 102 no such job, 103 cancelled.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import IO

__all__ = ["COMMANDS", "add_commands", "run_command"]

COMMANDS = ("queue", "cancel", "logs")
#: Finished jobs ``queue`` shows without ``-a`` (the most recent ones).
RECENT_FINISHED = 10
#: Where ``logs --sync-down`` copies a job's log (``NAME/ID/run.log`` under it).
SYNC_DIR = "~/skyward_logs"
_COLUMNS = ("ID", "NAME", "SUBMITTED", "STARTED", "DURATION", "RESOURCES", "STATUS")


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    q = commands.add_parser("queue", help="list the jobs of clusters (all clusters when none is named)")
    q.add_argument("names", nargs="*", metavar="NAME")
    q.add_argument("-a", "--all", action="store_true", help=f"every job (by default, the jobs not finished and "
                                                            f"the {RECENT_FINISHED} most recent finished ones)")
    q.add_argument("--json", action="store_true", help="print JSON instead of a table")

    c = commands.add_parser("cancel", help="cancel jobs of a cluster (every process, every node)")
    c.add_argument("name", metavar="NAME")
    c.add_argument("ids", nargs="*", type=int, metavar="ID")
    c.add_argument("--all", action="store_true", help="every job not finished")
    c.add_argument("--yes", "-y", action="store_true", help="do not ask (when on a terminal)")

    logs = commands.add_parser("logs", help="a cluster job's output (the latest job by default)")
    logs.add_argument("name", metavar="NAME")
    logs.add_argument("id", nargs="?", type=int, metavar="ID")
    logs.add_argument("--no-follow", action="store_true", help="print what is there and return")
    logs.add_argument("--status", action="store_true",
                      help="print the job's state; exit 0 succeeded, 100 failed, 101 not finished, 102 no such "
                           "job, 103 cancelled")
    logs.add_argument("--tail", type=int, default=-1, metavar="N", help="the last N lines first (default: all)")
    logs.add_argument("--sync-down", action="store_true",
                      help=f"copy the job's log (every node's lines) to {SYNC_DIR}/NAME/ID/run.log and print where")


def run_command(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    if args.command == "queue":
        return _queue(args, out)
    if args.command == "cancel":
        return _cancel(args, out, err)
    return _logs(args, out, err)


def _queue(args: argparse.Namespace, out: IO[str]) -> int:
    from skyward.clusters import jobs
    from skyward.clusters.state import ClusterStore
    from skyward.runtime.jobqueue import ACTIVE

    names = args.names or sorted(r.name for r in ClusterStore().all())
    found = {name: jobs.jobs(name) for name in names}  # (raises naming the cluster when there is none)
    if not args.all:
        for name, listed in found.items():
            done = [j for j in listed if j.status not in ACTIVE][-RECENT_FINISHED:]
            found[name] = [j for j in listed if j.status in ACTIVE or j in done]
    if args.json:
        json.dump({name: [j.as_dict() for j in listed] for name, listed in found.items()}, out, indent=2)
        out.write("\n")
        return 0
    for index, (name, listed) in enumerate(found.items()):
        out.write(("\n" if index else "") + f"Job queue of cluster {name}\n")
        rows = [list(_COLUMNS)] + [[str(j.id), j.name, _ago(j.submitted), _ago(j.started), _duration(j),
                                    j.resources, j.status] for j in reversed(listed)]
        widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS))]
        for row in rows:
            out.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n")
    if not names:
        out.write("no clusters\n")
    return 0


def _ago(when: float | None) -> str:
    if not when:
        return "-"
    seconds = max(0, int(time.time() - when))
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if seconds >= size:
            return f"{seconds // size} {unit} ago"
    return f"{seconds} s ago"


def _duration(job: object) -> str:
    started, ended = getattr(job, "started", None), getattr(job, "ended", None)
    if not started:
        return "-"
    seconds = int((ended or time.time()) - started)
    return f"{seconds // 3600}h {seconds % 3600 // 60}m {seconds % 60}s" if seconds >= 3600 else \
        f"{seconds // 60}m {seconds % 60}s" if seconds >= 60 else f"{seconds}s"


def _cancel(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    from skyward.clusters import jobs
    from skyward.errors import ConfigError

    if bool(args.ids) == bool(args.all):
        raise ConfigError("ID", "job ids, or --all (not both)", args.ids or "neither")
    what = "every unfinished job" if args.all else "job" + ("s " if len(args.ids) > 1 else " ") + \
        ", ".join(map(str, args.ids))
    if not args.yes and sys.stdin.isatty():
        if input(f"cancel {what} of cluster {args.name}? [y/N] ").strip().lower() not in ("y", "yes"):
            out.write("nothing cancelled\n")
            return 1
    cancelled, problems = jobs.cancel(args.name, None if args.all else args.ids)
    if problems:
        err.write(f"skyward: error: cancel on cluster {args.name}: not confirmed:\n  " + "\n  ".join(problems) + "\n")
        return 1
    if not cancelled:
        out.write(f"no job to cancel on cluster {args.name}\n")
    for i in cancelled:
        out.write(f"job {i} on cluster {args.name} CANCELLED (its processes confirmed gone on every node)\n")
    return 0


def _logs(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    from skyward.clusters import jobs

    found = jobs.job(args.name, args.id)
    if args.status:
        if found is None:
            out.write(f"no job {args.id} on cluster {args.name}\n" if args.id else
                      f"cluster {args.name} has no jobs\n")
            return jobs.NO_SUCH_JOB
        out.write(f"Job {found.id}: {found.status}\n")
        return jobs.STATUS_CODES.get(found.status, jobs.NOT_FINISHED)
    if found is None:
        err.write(f"skyward: error: no job {args.id} on cluster {args.name}\n" if args.id else
                  f"skyward: error: cluster {args.name} has no jobs (submit one with `skyward exec {args.name} "
                  f"TASK.yaml`)\n")
        return 1
    if args.sync_down:
        return _sync_down(args.name, found.id, out)
    jobs.logs(args.name, found.id, out, follow=not args.no_follow, tail=args.tail)
    # as `sky logs`: the job's status (0 succeeded, 100 failed, 101 not finished, 103 cancelled)
    ended = jobs.job(args.name, found.id) or found
    if ended.status in (jobs.FAILED, jobs.FAILED_SETUP, jobs.FAILED_DRIVER):
        err.write(f"skyward: job {ended.id} on cluster {args.name}: {ended.status} (exit code {ended.exit_code})\n")
    return jobs.STATUS_CODES.get(ended.status, jobs.NOT_FINISHED)


def _sync_down(name: str, job_id: int, out: IO[str]) -> int:
    """``logs --sync-down``: the job's log as it is now, every node's lines, in a local file."""
    import os

    from skyward.clusters import jobs

    where = os.path.join(SYNC_DIR, name, str(job_id))
    folder = os.path.expanduser(where)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "run.log"), "w") as log:
        jobs.logs(name, job_id, log, follow=False)
    out.write(f"Job {job_id} logs: {where}\n")
    return 0
