"""The cluster commands of ``skyward``, as SkyPilot users type them::

    skyward launch -c NAME TASK.yaml [-i MIN] [--down] [-d] [flags]   create or reuse, then run
    skyward exec NAME TASK.yaml [-d] [--env K=V]...                   run only the run block
    skyward status [NAME...] [--json]                                 what is up, reconciled
    skyward stop NAME... [-y]                                         workers (and cloud machines) off
    skyward start NAME...                                             on again
    skyward down NAME... | --all [-y]                                 end them (and leftover pools)
    skyward queue / cancel / logs                                     a cluster's jobs (skyward.cli.jobs)

``launch -c`` runs the setup block when the cluster is created, and again only when the setup
block (or the image it builds) changed; the run block always, as a job in the cluster's queue
(``Job ID: N``), followed until it ends unless ``-d``: the job goes on on the cluster whatever
becomes of the client, ``logs`` follows it, and autostop waits for it to end. ``--down`` without ``-i`` (SkyPilot's) tears the cluster
down once its last job has finished: autostop after 0 idle minutes, a teardown.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import IO, Any

__all__ = ["add_commands", "run_command"]

COMMANDS = ("exec", "status", "stop", "start", "logs", "queue", "cancel")


def add_cluster_flags(launch: argparse.ArgumentParser) -> None:
    """``launch``'s cluster flags: ``-c NAME``, ``-i MIN``, ``--down``, ``-d``."""
    launch.add_argument("-c", "--cluster", metavar="NAME", help="the cluster to create or reuse (stays up "
                                                                 "after the run; `skyward down NAME` ends it)")
    _autostop_flags(launch)
    launch.add_argument("-d", "--detach-run", action="store_true",
                        help="submit the run block as a job and return; `skyward logs NAME` follows it (needs -c)")


def _autostop_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("-i", "--idle-minutes-to-autostop", dest="idle_minutes", type=float, metavar="MIN",
                   help="autostop: end the workers (on AWS: stop the machines) after MIN minutes with no "
                        "client attached; fractions allowed")
    p.add_argument("--down", dest="autostop_down", action="store_true",
                   help="tear the cluster down (machines terminated, the cluster forgotten): with -i MIN after "
                        "MIN idle minutes; alone (launch) once the last job has finished")


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``exec``, ``status``, ``stop``, ``start``, ``logs`` to the ``skyward`` parser."""
    ex = commands.add_parser("exec", help="run a task file's run block on an existing cluster",
                             description="Sync the workdir and run only the run block of TASK.yaml on "
                                         "cluster NAME, at once (no provisioning, no setup).")
    ex.add_argument("name", metavar="NAME")
    ex.add_argument("task", metavar="TASK.yaml")
    ex.add_argument("--env", action="append", default=[], metavar="K[=V]", help="set a variable; repeatable")
    ex.add_argument("--secret", action="append", default=[], metavar="K[=V]", help="set a secret; repeatable")
    ex.add_argument("-d", "--detach-run", action="store_true", help="submit the job and return")

    st = commands.add_parser("status", help="list named clusters (reconciled with their nodes)")
    st.add_argument("names", nargs="*", metavar="NAME")
    st.add_argument("--json", action="store_true", help="print JSON instead of a table")

    stop = commands.add_parser("stop", help="stop clusters' workers (and cloud machines, disks kept)")
    stop.add_argument("names", nargs="+", metavar="NAME")
    stop.add_argument("--yes", "-y", action="store_true", help="do not ask (when on a terminal)")

    start = commands.add_parser("start", help="start stopped clusters again")
    start.add_argument("names", nargs="+", metavar="NAME")
    _autostop_flags(start)

    from skyward.cli import jobs

    jobs.add_commands(commands)  # queue, cancel, logs


def run_command(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    """Run one of :data:`COMMANDS` (errors are the caller's to report)."""
    if args.command == "exec":
        return _exec(args, out, err)
    if args.command == "status":
        return _status(args, out)
    if args.command == "stop":
        return _each(args.names, "stop", out, err, ask=not args.yes)
    if args.command == "start":
        return _start(args, out, err)
    from skyward.cli import jobs

    return jobs.run_command(args, out, err)


# -- launch -c / exec ---------------------------------------------------------------------------


def cluster_pool_args(args: argparse.Namespace) -> dict[str, Any]:
    """The ComputePool arguments ``launch -c`` adds (validated by the pool)."""
    if args.cluster is None:
        for flag, given in (("-i", args.idle_minutes is not None), ("--down", args.autostop_down),
                            ("-d", args.detach_run)):
            if given:
                from skyward.errors import ConfigError

                raise ConfigError(flag, f"{flag} only with -c NAME (a cluster that stays up)", "no -c")
        return {}
    return {"name": args.cluster, "idle_minutes": args.idle_minutes, "down": args.autostop_down}


def _exec(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    from skyward.clusters.session import resolve
    from skyward.launch import execute, plan

    record, _ = resolve(args.name, {})  # raises naming the way out when there is none
    p = plan(args.task, num_nodes=record.nodes if record else None, env=args.env, secrets=args.secret)
    out.flush()
    return execute(p, cluster={"name": args.name, "attach_only": True}, run_setup=False,
                   detach_run=args.detach_run, err=err)


# -- status, stop, start, down, logs ------------------------------------------------------------


_COLUMNS = ("NAME", "PROVIDER", "NODES", "RESOURCES", "STATUS", "AUTOSTOP", "LAUNCHED", "$/H", "COST")


def _status(args: argparse.Namespace, out: IO[str]) -> int:
    from skyward.clusters import manage

    found = manage.status(args.names or None)
    if args.json:
        json.dump([s.as_dict() for s in found], out, indent=2)
        out.write("\n")
        return 0
    missing = [n for n in args.names if n not in {s.record.name for s in found}]
    if not found:
        out.write("no clusters" + (f" named {', '.join(args.names)}" if args.names else "") + "\n")
        return 1 if args.names else 0
    rows = []
    for s in found:
        d = s.as_dict()
        price, cost = _dollars(d["price_per_hour"]), _dollars(d["cost_so_far"])
        status = s.status + (" (attached)" if s.holder else "")
        rows.append([d["name"], d["provider"], str(d["nodes"]), d["resources"], status, s.record.autostop,
                     _ago(d["launched"]), price, cost])
    widths = [max(len(r[i]) for r in [list(_COLUMNS), *rows]) for i in range(len(_COLUMNS))]
    for row in [list(_COLUMNS), *rows]:
        out.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n")
    for name in missing:
        out.write(f"no cluster named {name}\n")
    return 1 if missing else 0


def _ago(when: float) -> str:
    seconds = max(0, int(time.time() - when))
    if seconds < 3600:
        return f"{seconds // 60}m ago"
    if seconds < 86400:
        return f"{seconds // 3600}h ago"
    return f"{seconds // 86400}d ago"


def _each(names: list[str], what: str, out: IO[str], err: IO[str], *, ask: bool) -> int:
    from skyward.clusters import manage
    from skyward.errors import SkywardError

    if ask and sys.stdin.isatty():
        answer = input(f"{what} {', '.join(names)}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            out.write(f"nothing to {what}\n")
            return 1
    code = 0
    for name in names:
        try:
            problems = getattr(manage, what)(name)
        except SkywardError as exc:
            err.write(f"skyward: error: {exc}\n")
            code = 1
            continue
        if problems:
            err.write(f"skyward: error: {what} {name}: not confirmed:\n  " + "\n  ".join(problems) + "\n")
            code = 1
        else:
            out.write({"down": f"cluster {name} ended (workers confirmed gone, machines released)\n",
                       "stop": f"cluster {name} stopped (start it with `skyward start {name}`)\n"}[what])
    return code


def _start(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    from skyward.errors import ConfigError
    from skyward.pool import ComputePool

    if args.autostop_down and args.idle_minutes is None:  # (alone it would end the cluster at once)
        raise ConfigError("--down", "--down with -i MIN on start (a teardown after MIN idle minutes)", "--down alone")

    for name in args.names:
        with ComputePool(name=name, idle_minutes=args.idle_minutes, down=args.autostop_down, console=False):
            pass
        out.write(f"cluster {name} is up\n")
    return 0


def down_names(names: list[str], everything: bool, yes: bool, out: IO[str], err: IO[str]) -> tuple[int, list[str]]:
    """``skyward down``'s cluster part: end the named clusters (every one with ``everything``);
    returns the exit status so far and the names that are not clusters (pool ids, maybe)."""
    from skyward.clusters.state import ClusterStore

    known = {r.name for r in ClusterStore().all()}
    clusters = sorted(known) if everything else [n for n in names if n in known]
    rest = [] if everything else [n for n in names if n not in known]
    code = _each(clusters, "down", out, err, ask=not yes and everything) if clusters else 0
    return code, rest


def _dollars(amount: float | None) -> str:
    """Cents, or a tenth of a cent below a dollar (a t3.medium costs $0.0416/h)."""
    if amount is None:
        return "-"
    return f"{amount:.2f}" if amount >= 1 else f"{amount:.3f}"
