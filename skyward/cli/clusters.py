"""The cluster commands of ``skyward``, as SkyPilot users type them::

    skyward launch -c NAME [TASK.yaml|COMMAND] [-i MIN] [--down] [-d] [--fast] [flags]  create or reuse, then run
    skyward exec NAME TASK.yaml|COMMAND [-d] [--env K=V]... [flags]           run only the run block
    skyward status [NAME...] [-r] [-o json|--json]                            what is up, reconciled
    skyward stop NAME... [-y]                                                 workers (and cloud machines) off
    skyward start NAME... [-y]                                                on again
    skyward down NAME... | -a [-y]                                            end them (and leftover pools)
    skyward queue / cancel / logs                                             a cluster's jobs (skyward.cli.jobs)
    skyward autostop NAME... [-i MIN] [--down] | --cancel [-y]                set or cancel autostop, live
    skyward cost-report                                                       what each cluster cost so far

A task is a task file or, as in SkyPilot, a shell command (``skyward exec dev 'nvidia-smi'``);
``launch -c NAME`` with neither brings the cluster up (or reuses it) and runs nothing.

``launch -c`` runs the setup block on every launch, as SkyPilot's does (with ``--fast``: when
the cluster is created, and again only when the setup block or its variables changed); the run
block always, on the task's ``num_nodes`` (the cluster's first nodes when it has more). The run
is a job in the cluster's queue (``Job ID: N``), followed until it ends unless ``-d``: the job
goes on on the cluster whatever becomes of the client, ``logs`` follows it, and autostop waits
for it to end. ``--down`` without ``-i`` (SkyPilot's) tears the cluster down once its last job
has finished: autostop after 0 idle minutes, a teardown.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import IO, Any

__all__ = ["add_commands", "run_command"]

COMMANDS = ("exec", "status", "stop", "start", "logs", "cost-report", "autostop", "queue", "cancel")
#: ``skyward autostop`` without -i (SkyPilot's default idle minutes).
DEFAULT_IDLE_MINUTES = 5.0


def add_task_flags(p: argparse.ArgumentParser) -> None:
    """The task flags ``launch`` and ``exec`` share, as SkyPilot spells them."""
    p.add_argument("--num-nodes", type=int, metavar="N", help="nodes (overrides num_nodes; on exec, at most the "
                                                              "cluster's: the run uses the first N)")
    p.add_argument("--env", action="append", default=[], metavar="K[=V]",
                   help="set a variable (K alone: take it from this environment); repeatable; wins over --env-file")
    p.add_argument("--env-file", metavar="F", help="a dotenv file of K=V lines")
    p.add_argument("--secret", action="append", default=[], metavar="K[=V]",
                   help="set a secret (never shown); K alone: take it from this environment; repeatable")
    p.add_argument("--workdir", metavar="DIR", help="a local directory synced to every node, where setup and run "
                                                    "start (overrides workdir)")
    p.add_argument("--git-url", metavar="URL", help="a git repository cloned on every node as the workdir "
                                                    "(https://..., git@..., file://... or a path)")
    p.add_argument("--git-ref", metavar="REF", help="the branch, tag or commit of --git-url (or of the task's "
                                                    "git workdir) to check out")
    p.add_argument("-n", "--name", dest="job_name", metavar="NAME",
                   help="the task's name (the job's NAME in `skyward queue`; overrides the file's name)")


def task_plan(args: argparse.Namespace, num_nodes: int | None, **shape: Any) -> Any:
    """The plan of ``launch``'s or ``exec``'s task: a task file or a command (``args.entrypoint``),
    with the task flags applied. Raises ConfigError (a TaskFileError for the file's problems)."""
    from skyward.errors import ConfigError
    from skyward.launch import plan
    from skyward.launch.plan import entrypoint

    path, command = entrypoint(args.entrypoint)
    args.task_file = path
    if path is None and command is None and getattr(args, "cluster", None) is None:
        raise ConfigError("TASK", "a task file or a command to run (or -c NAME alone: bring a cluster up and run "
                          "nothing)", "nothing")
    from dataclasses import replace

    found = plan(path, command=command, num_nodes=num_nodes, env=args.env, env_file=args.env_file,
                 secrets=args.secret, workdir=args.workdir, git_url=args.git_url, git_ref=args.git_ref, **shape)
    return found if args.job_name is None else replace(found, name=args.job_name)


def add_cluster_flags(launch: argparse.ArgumentParser) -> None:
    """``launch``'s cluster flags: ``-c NAME``, ``-i MIN``, ``--down``, ``-d``."""
    launch.add_argument("-c", "--cluster", metavar="NAME", help="the cluster to create or reuse (stays up "
                                                                 "after the run; `skyward down NAME` ends it)")
    _autostop_flags(launch)
    launch.add_argument("-d", "--detach-run", action="store_true",
                        help="submit the run block as a job and return; `skyward logs NAME` follows it (needs -c)")
    launch.add_argument("--fast", action="store_true",
                        help="on a cluster that is up, run setup only when it changed since it last ran there "
                             "(without it, setup runs on every launch, as SkyPilot's)")


def _autostop_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("-i", "--idle-minutes-to-autostop", dest="idle_minutes", type=float, metavar="MIN",
                   help="autostop: end the workers (on AWS: stop the machines) after MIN minutes with no "
                        "client attached; fractions allowed")
    p.add_argument("--down", dest="autostop_down", action="store_true",
                   help="tear the cluster down (machines terminated, the cluster forgotten): with -i MIN after "
                        "MIN idle minutes; alone (launch) once the last job has finished")


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``exec``, ``status``, ``stop``, ``start``, ``logs`` to the ``skyward`` parser."""
    ex = commands.add_parser("exec", help="run a task file's run block, or a command, on an existing cluster",
                             description="Sync the workdir and run only the run block of TASK.yaml (or COMMAND, "
                                         "a shell command) on cluster NAME, at once (no provisioning, no setup).")
    ex.add_argument("name", metavar="NAME")
    ex.add_argument("entrypoint", nargs="+", metavar="TASK.yaml|COMMAND",
                    help="a task file, or a shell command run on the nodes (several words are joined)")
    add_task_flags(ex)
    ex.add_argument("-d", "--detach-run", action="store_true", help="submit the job and return")

    st = commands.add_parser("status", help="list named clusters (reconciled with their nodes)")
    st.add_argument("names", nargs="*", metavar="NAME")
    st.add_argument("-o", "--output", choices=("table", "json"), default="table",
                    help="table (default) or json, for scripts")
    st.add_argument("--json", action="store_true", help="print JSON instead of a table (-o json)")
    st.add_argument("-r", "--refresh", action="store_true",
                    help="ask the nodes (every status does: accepted as SkyPilot spells it)")

    stop = commands.add_parser("stop", help="stop clusters' workers (and cloud machines, disks kept)")
    stop.add_argument("names", nargs="+", metavar="NAME")
    stop.add_argument("--yes", "-y", action="store_true", help="do not ask (when on a terminal)")

    start = commands.add_parser("start", help="start stopped clusters again")
    start.add_argument("names", nargs="+", metavar="NAME")
    start.add_argument("--yes", "-y", action="store_true", help="do not ask (when on a terminal)")
    _autostop_flags(start)

    commands.add_parser("cost-report", help="what each cluster has cost so far",
                        description="Each cluster this machine knows, with its price per hour and what it has "
                                    "cost since it was launched (from the prices its machines were rented at), "
                                    "and the total.")

    auto = commands.add_parser("autostop", help="set or cancel running clusters' autostop",
                               description="Set (or with --cancel remove) the autostop of running clusters: "
                                           "their workers take it at once, idle time counted from now.")
    auto.add_argument("names", nargs="+", metavar="NAME")
    auto.add_argument("-i", "--idle-minutes", dest="idle_minutes", type=_minutes, metavar="MIN",
                      help=f"stop after MIN idle minutes (fractions allowed; default {DEFAULT_IDLE_MINUTES:g})")
    auto.add_argument("--down", dest="autostop_down", action="store_true",
                      help="tear the cluster down instead of stopping it")
    auto.add_argument("--cancel", action="store_true", help="remove the autostop")
    auto.add_argument("--yes", "-y", action="store_true", help="do not ask (when on a terminal)")

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
    if args.command == "cost-report":
        return _cost_report(out)
    if args.command == "autostop":
        return _autostop(args, out, err)
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
    return {"name": args.cluster, "idle_minutes": args.idle_minutes, "down": args.autostop_down, "fast": args.fast}


def _exec(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    from skyward.clusters.state import ClusterStore
    from skyward.transport import warm

    known = ClusterStore().get(args.name) if isinstance(args.name, str) else None
    if known is not None:  # the handshakes go on while the pool's modules load (transport.warm)
        warm.warm(known.instances)
    try:
        return _exec_on(args, out, err)
    finally:
        warm.release()


def _exec_on(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    from skyward.clusters.session import resolve
    from skyward.errors import ConfigError
    from skyward.launch import execute

    record, _ = resolve(args.name, {})  # raises naming the way out when there is none
    have = record.nodes if record else None
    try:
        if args.num_nodes is not None and have is not None and args.num_nodes > have:
            raise ConfigError("--num-nodes", f"at most the {have} node(s) of cluster {args.name} (the run uses "
                              "the first N)", args.num_nodes)
        p = task_plan(args, args.num_nodes)  # (else the task's num_nodes: the cluster's first nodes)
    except ConfigError as exc:
        err.write(f"skyward: error: {exc}\n")
        return 2
    out.flush()
    return execute(p, cluster={"name": args.name, "attach_only": True}, run_setup=False,
                   detach_run=args.detach_run, err=err)


# -- status, stop, start, down, logs ------------------------------------------------------------


_COLUMNS = ("NAME", "PROVIDER", "NODES", "RESOURCES", "STATUS", "AUTOSTOP", "LAUNCHED", "$/H", "COST")


def _status(args: argparse.Namespace, out: IO[str]) -> int:
    from skyward.clusters import manage

    found = manage.status(args.names or None)
    if args.json or args.output == "json":
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
    _table(_COLUMNS, rows, out)
    for name in missing:
        out.write(f"no cluster named {name}\n")
    return 1 if missing else 0


def _table(columns: tuple[str, ...], rows: list[list[str]], out: IO[str]) -> None:
    widths = [max(len(r[i]) for r in [list(columns), *rows]) for i in range(len(columns))]
    for row in [list(columns), *rows]:
        out.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n")


_COST_COLUMNS = ("NAME", "PROVIDER", "RESOURCES", "STATUS", "LAUNCHED", "$/H", "COST")


def _cost_report(out: IO[str]) -> int:
    """Every cluster's price per hour and cost since launch, from the records alone (no node is
    asked), and the total."""
    from skyward.clusters.manage import ClusterStatus
    from skyward.clusters.state import ClusterStore

    records = ClusterStore().all()
    if not records:
        out.write("no clusters\n")
        return 0
    rows, total = [], 0.0
    for record in records:
        d = ClusterStatus(record, record.status).as_dict()
        total += d["cost_so_far"] or 0.0
        rows.append([d["name"], d["provider"], d["resources"], d["status"], _ago(d["launched"]),
                     _dollars(d["price_per_hour"]),
                     _dollars(d["cost_so_far"])])
    _table(_COST_COLUMNS, rows, out)
    out.write(f"\ntotal ${total:.2f} for {len(records)} cluster(s) (price x time since launch; - : no price "
              "known, as on SSH hosts; Local costs 0)\n")
    return 0


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

    if ask and not _confirmed(what, names, out):
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


def _confirmed(what: str, names: list[str], out: IO[str]) -> bool:
    """Whether to go on: yes when not on a terminal, else what the user answers."""
    if not sys.stdin.isatty():
        return True
    if input(f"{what} {', '.join(names)}? [y/N] ").strip().lower() in ("y", "yes"):
        return True
    out.write(f"nothing to {what}\n")
    return False


def _minutes(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of idle minutes >= 0 (fractions allowed), "
                                         f"got {text!r}") from None


def _autostop(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    from skyward.clusters import manage
    from skyward.errors import ConfigError, SkywardError

    if args.cancel and (args.idle_minutes is not None or args.autostop_down):
        given = "--cancel with " + ("-i" if args.idle_minutes is not None else "--down")
        raise ConfigError("--cancel", "--cancel alone (it removes the autostop), or -i MIN [--down] to set one", given)
    minutes = None if args.cancel else DEFAULT_IDLE_MINUTES if args.idle_minutes is None else args.idle_minutes
    if minutes is not None and not 0 <= minutes < float("inf"):
        raise ConfigError("-i", "a number of idle minutes >= 0 (fractions allowed; 0: as soon as no client is "
                                "attached and no detached run is left)", minutes)
    if not args.yes and not _confirmed("autostop", args.names, out):
        return 1
    code = 0
    for name in args.names:
        try:
            problems = manage.autostop(name, minutes, args.autostop_down)
        except SkywardError as exc:
            err.write(f"skyward: error: {exc}\n")
            code = 1
            continue
        done = "autostop cancelled" if minutes is None else \
            f"autostop after {minutes:g}m idle" + (", then down" if args.autostop_down else "")
        out.write(f"cluster {name}: {done}\n")
        if problems:
            err.write(f"skyward: error: autostop {name}: not taken everywhere:\n  " + "\n  ".join(problems) + "\n")
            code = 1
    return code


def _start(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    from skyward.errors import ConfigError
    from skyward.pool import ComputePool

    if args.autostop_down and args.idle_minutes is None:  # (alone it would end the cluster at once)
        raise ConfigError("--down", "--down with -i MIN on start (a teardown after MIN idle minutes)", "--down alone")

    if not args.yes and sys.stdin.isatty():
        answer = input(f"start {', '.join(args.names)}? [Y/n] ")
        if answer.strip().lower() not in ("", "y", "yes"):
            out.write("nothing started\n")
            return 1
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
