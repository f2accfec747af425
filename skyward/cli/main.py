"""The ``skyward`` command: run task files, and see and remove the cloud resources pools left behind.

::

    skyward launch [-c NAME [-i MIN] [--down] [-d]] [TASK.yaml | COMMAND] [--num-nodes N] [--gpus L4:2]
                   [--cpus 8+] [--memory 32+] [--provider local|ssh|aws|slurm]
                   [--infra slurm/PARTITION] [--hosts user@h1,user@h2]
                   [--env K[=V]]... [--env-file F] [--secret K[=V]]... [--workdir D | --git-url U [--git-ref R]]
                   [--dryrun] [-y]
    skyward exec NAME TASK.yaml|COMMAND [-d] [the task flags]     skyward status [NAME...] [-r] [-o json]
    skyward stop NAME...   skyward start NAME... [-y]   skyward logs NAME   skyward cost-report
    skyward ls [--region R] [--profile P] [--json]
    skyward jobs launch|queue|logs|cancel ...   (managed jobs: skyward.cli.managed)
    skyward catalog refresh [--region R] [--profile P]
    skyward down NAME|POOL... [--region R] [--profile P] [--timeout S]
    skyward down -a|--all [--yes] [--region R] [--profile P] [--timeout S]
    skyward dashboard [--port N] [--no-browser]     (the skyward[dashboard] extra: skyward.dashboard)

Named clusters (``launch -c``, ``exec``, ``status``, ``stop``, ``start``, ``down NAME``,
``logs``) are :mod:`skyward.cli.clusters`'s.

``ls`` lists every skyward-tagged EC2 instance (not yet terminated), key pair and security
group in a region, with its pool id, type, state, age and approximate on-demand price per
hour. ``down`` removes one pool's resources (or every pool's, with ``--all``) and waits until
AWS confirms it: instances shutting down or terminated, key pairs and security groups gone.

``launch`` runs a SkyPilot-style task file on a pool (see :mod:`skyward.launch`): Local by
default, flags override the file, ``--dryrun`` prints the plan and starts nothing. Its exit
status is the failing node's exit code (128 + N for signal N) when a command fails.

Exit status: 0 on success (also when there was nothing to remove), 1 when something failed
or could not be confirmed, 2 for a usage error (a bad task file too), 130 when interrupted.

boto3 (and rich, for tables on a terminal) are imported only when a command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import IO, Any

__all__ = ["build_parser", "main"]

_COLUMNS = ("POOL", "RESOURCE", "ID", "TYPE", "MARKET", "STATE", "AGE", "PRICE/H")


def build_parser() -> argparse.ArgumentParser:
    """The ``skyward`` command's argument parser, every subcommand included."""
    from skyward._version import __version__

    parser = argparse.ArgumentParser(
        prog="skyward",
        description="Run task files on a pool; inspect and remove the cloud resources of skyward pools "
                    "(tagged skyward:pool=<id>).",
        epilog="Credentials and the default region come from the usual AWS configuration "
               "(environment variables, ~/.aws/config, AWS_PROFILE, SSO).",
    )
    parser.add_argument("--version", action="version", version=f"skyward {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def aws_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--region", help="AWS region (default: the configured one)")
        p.add_argument("--profile", help="AWS profile from ~/.aws/config")

    ls = commands.add_parser("ls", help="list skyward-tagged instances, key pairs and security groups",
                             description="List every skyward-tagged EC2 instance (not yet terminated), "
                                         "key pair and security group in a region.")
    aws_options(ls)
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")

    down = commands.add_parser("down", help="remove a pool's resources (or every pool's) and confirm",
                               description="Terminate the instances of a pool, delete its key pair and "
                                           "security group, and wait until AWS confirms.")
    down.add_argument("pools", nargs="*", metavar="NAME|POOL",
                      help="a cluster's name (as `skyward status` shows it) or a pool id (as `skyward ls` shows it)")
    down.add_argument("-a", "--all", action="store_true", help="end every cluster and remove every skyward pool's "
                                                         "resources")
    down.add_argument("--yes", "-y", action="store_true", help="do not ask before --all (when on a terminal)")
    down.add_argument("--timeout", type=float, default=300.0, metavar="S",
                      help="seconds to wait for AWS to confirm (default: 300)")
    aws_options(down)

    catalog = commands.add_parser("catalog", help="renew the AWS catalog of instance types and prices",
                                  description="Fetch instance types (with their GPUs) and on-demand and spot "
                                              "prices from AWS, and cache them under ~/.skyward/catalog "
                                              "(SKYWARD_HOME) with today's date.")
    catalog.add_argument("action", choices=["refresh"], help="refresh: fetch and cache the catalog")
    aws_options(catalog)

    launch = commands.add_parser(
        "launch", help="run a task file (SkyPilot task YAML) or a command on every node of a pool",
        description="Run a task file's setup and run blocks (or a shell command) on every node of a fresh pool "
                    "(Local by default) or of cluster -c NAME, streaming each node's output; flags override the "
                    "file. With -c NAME and nothing to run: bring the cluster up (or reuse it) and run nothing.")
    launch.add_argument("entrypoint", nargs="*", metavar="TASK.yaml|COMMAND",
                        help="a task file, or a shell command run on every node (several words are joined)")
    launch.add_argument("--gpus", metavar="ACC", help="accelerators per node, e.g. L4:2 (overrides "
                                                     "resources.accelerators)")
    launch.add_argument("--cpus", metavar="N[+]", help="vCPUs per node, e.g. 8 or 8+ (at least)")
    launch.add_argument("--memory", metavar="N[+]", help="GiB of memory per node, e.g. 32+")
    launch.add_argument("--provider", default=None, metavar="{local,ssh,aws,slurm}",
                        help="where the nodes come from (default: the one resources.infra names, else local, "
                             "this machine)")
    launch.add_argument("--infra", default=None, metavar="PROVIDER[/REGION]",
                        help="SkyPilot's spelling of --provider, with a region: aws/us-east-1, slurm/PARTITION")
    launch.add_argument("--hosts", default="", metavar="H1,H2", help="SSH hosts, e.g. user@h1,user@h2 "
                                                                    "(with --provider ssh)")
    launch.add_argument("--dryrun", action="store_true", help="print the plan and start nothing")
    launch.add_argument("--yes", "-y", action="store_true", help="do not ask before renting machines")
    from skyward.cli import clusters

    clusters.add_task_flags(launch)
    clusters.add_cluster_flags(launch)
    clusters.add_commands(commands)
    board = commands.add_parser("dashboard", help="clusters, nodes, jobs and logs in a browser (127.0.0.1 only)",
                                description="Serve the dashboard on 127.0.0.1 with a new token, print its URL "
                                            "and open it (needs the skyward[dashboard] extra).")
    board.add_argument("--port", type=int, default=None, metavar="N",
                       help="the port (default: 8790, or a free one when it is taken; 0: any free one)")
    board.add_argument("--no-browser", action="store_true", help="print the URL only")
    from skyward.cli import managed

    managed.add_commands(commands)
    return parser


def _age(when: datetime | None, now: datetime) -> str:
    if when is None:
        return "-"
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    seconds = max(0, int((now - when).total_seconds()))
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600}h"


def _rows(found: Any) -> list[dict[str, Any]]:
    from skyward.providers.aws import catalog

    now = datetime.now(UTC)
    rows = []
    for i in found.instances:
        if i.state == "terminated":
            continue
        known = catalog.by_name(i.instance_type)
        price = None if known is None else known.price_per_hour
        rows.append({"pool": i.pool, "resource": "instance", "id": i.id, "type": i.instance_type,
                     "market": i.market, "state": i.state, "age": _age(i.launched, now),
                     "zone": i.zone, "private_ip": i.private_ip, "price_per_hour": price})
    for k in found.key_pairs:
        rows.append({"pool": k.pool, "resource": "key-pair", "id": k.name, "type": "", "market": "",
                     "state": "", "age": _age(k.created, now), "price_per_hour": None})
    for g in found.security_groups:
        rows.append({"pool": g.pool, "resource": "security-group", "id": g.id, "type": "", "market": "",
                     "state": "", "age": _age(g.created, now), "price_per_hour": None})
    return sorted(rows, key=lambda r: (r["pool"], r["resource"] != "instance", r["id"]))


def _cells(row: dict[str, Any]) -> list[str]:
    price = row["price_per_hour"]
    shown = "-" if price is None else f"~${price:.2f}" + (" od" if row["market"] == "spot" else "")
    return [row["pool"], row["resource"], row["id"], row["type"] or "-", row["market"] or "-",
            row["state"] or "-", row["age"], shown]


def _print_table(rows: list[dict[str, Any]], out: IO[str]) -> None:
    cells = [_cells(r) for r in rows]
    if out.isatty():
        try:
            from rich.console import Console
            from rich.table import Table
        except ImportError:
            pass
        else:
            table = Table(*_COLUMNS, box=None, header_style="bold")
            for line in cells:
                table.add_row(*line)
            Console(file=out).print(table)
            return
    widths = [max(len(c[i]) for c in [list(_COLUMNS), *cells]) for i in range(len(_COLUMNS))]
    for line in [list(_COLUMNS), *cells]:
        out.write("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() + "\n")


def _connect(args: argparse.Namespace) -> Any:
    from skyward._optional import require
    from skyward.providers.aws.ec2 import EC2

    require("boto3", f"skyward {args.command}")  # without it: one line naming the extra

    return EC2.connect(args.region, profile=args.profile)


def _ls(args: argparse.Namespace, out: IO[str]) -> int:
    from skyward.providers.aws.inventory import list_resources

    ec2 = _connect(args)
    rows = _rows(list_resources(ec2))
    if args.json:
        json.dump(rows, out, indent=2)
        out.write("\n")
    elif not rows:
        out.write(f"no skyward resources in {ec2.region}\n")
    else:
        _print_table(rows, out)
        pools = sorted({r["pool"] for r in rows})
        live = sum(1 for r in rows if r["resource"] == "instance")
        out.write(f"\n{len(pools)} pool(s), {live} instance(s) in {ec2.region}; "
                  "prices are approximate on-demand list prices (od)\n")
    return 0


def _down(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    from skyward.cli.clusters import down_names

    code, rest = down_names(args.pools, args.all, args.yes, out, err)
    not_pools = [n for n in rest if not _POOL_ID.fullmatch(n)]
    for name in not_pools:
        err.write(f"skyward: error: {name!r} is neither a cluster (see `skyward status`) nor a pool id "
                  "(8 hex digits, see `skyward ls`)\n")
        code = 1
    pools = [n for n in rest if _POOL_ID.fullmatch(n)]
    if args.all and not _aws_configured(args):
        return code  # (no AWS account here: the clusters were all there was)
    for pool in [None] if args.all else pools:
        args.pool = pool
        code = max(code, _down_pool(args, out, err))
    return code


_POOL_ID = __import__("re").compile(r"[0-9a-f]{8}")


def _aws_configured(args: argparse.Namespace) -> bool:
    """Whether an AWS region is known (flag, environment or config), so `down --all` can look."""
    if args.region or args.profile:
        return True
    from importlib.util import find_spec

    from skyward._optional import require

    if find_spec("boto3") is None:
        return False
    return require("boto3", "skyward down --all").session.Session().region_name is not None


def _down_pool(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    from skyward.providers.aws.inventory import destroy, list_resources

    ec2 = _connect(args)
    pool = None if args.all else args.pool
    found = list_resources(ec2, pool)
    what = f"pool {pool}" if pool else "every skyward pool"
    if found.empty:
        out.write(f"nothing to remove for {what} in {ec2.region}\n")
        return 0
    out.write(f"removing {what} in {ec2.region}: {found.describe()}\n")
    if args.all and not args.yes and sys.stdin.isatty():
        answer = input(f"remove the resources of {len(found.pools)} pool(s)? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            out.write("nothing removed\n")
            return 1
    left = destroy(ec2, pool, timeout=args.timeout)
    if not left.empty:
        err.write(f"skyward: error: not confirmed removed after {args.timeout:g}s: {left.describe()}\n")
        return 1
    from skyward.providers.aws.release import remove_files

    for gone in found.pools:  # (their private files: a killed client's login key among them)
        remove_files(gone)
    out.write(f"removed and confirmed: {what} ({len(found.live_instances)} instance(s), "
              f"{len(found.key_pairs)} key pair(s), {len(found.security_groups)} security group(s))\n")
    return 0


def _launch(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    from skyward.cli.clusters import cluster_pool_args, task_plan
    from skyward.errors import ConfigError, SkywardError
    from skyward.launch import execute

    args.provider_given = args.provider is not None or args.infra is not None
    try:
        cluster = cluster_pool_args(args)
        p = task_plan(args, args.num_nodes, gpus=args.gpus, cpus=args.cpus, memory=args.memory,
                      provider=args.provider, infra=args.infra, hosts=[h for h in args.hosts.split(",") if h.strip()])
        # A provider the task file's infra names counts as given, as --provider does.
        given = args.provider_given or p.provider != "local"
        # A command (or nothing) asks no shape of its own: an existing cluster is used as it is.
        shaped = args.task_file is not None or args.num_nodes is not None or args.gpus is not None
        if args.cluster is not None and not given:
            from skyward.launch.cluster import as_on_cluster

            shown = as_on_cluster(p, args.cluster, shape_given=shaped)
        else:
            shown = p
        out.write(shown.describe() + "\n")
    except ConfigError as exc:
        err.write(f"skyward: error: {exc}\n")
        return 2
    except SkywardError as exc:
        err.write(f"skyward: error: {exc}\n")
        return 1
    if args.dryrun:
        out.write("dry run: nothing was started\n")
        return 0
    if shown.provider != "local" and not args.yes and sys.stdin.isatty():
        answer = input(f"start {shown.nodes} node(s) on {shown.provider}? [Y/n] ")
        if answer.strip().lower() not in ("", "y", "yes"):
            out.write("nothing started\n")
            return 1
    out.flush()
    if args.cluster is None:
        return execute(p, err=err)
    if cluster["idle_minutes"] is None and p.autostop is not None:  # the task file's resources.autostop
        cluster.update(idle_minutes=p.autostop.idle_minutes, down=cluster["down"] or p.autostop.down)
    return execute(p, err=err, cluster={**cluster, "provider_given": given, "shape_given": shaped},
                   detach_run=args.detach_run)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (see the module docstring)."""
    from skyward.errors import SkywardError

    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version (0) and usage errors (2)
        return int(exc.code or 0)
    if args.command == "down" and (args.all == bool(args.pools)):
        print("usage: skyward down [-h] [--yes] [--timeout S] [--region REGION] [--profile PROFILE] "
              "(NAME|POOL... | -a/--all)\nskyward down: error: give cluster names or pool ids, or --all", file=sys.stderr)
        return 2
    if args.command == "launch":
        return _launch(args, sys.stdout, sys.stderr)
    from skyward.cli import clusters

    try:
        if args.command in clusters.COMMANDS:
            return clusters.run_command(args, sys.stdout, sys.stderr)
        if args.command == "jobs":
            from skyward.cli import managed

            return managed.run_command(args, sys.stdout, sys.stderr)
        if args.command == "catalog":
            from skyward.providers.aws import catalog_cache

            path = catalog_cache.refresh(_connect(args), profile=args.profile)
            print(f"catalog written to {path}\n{catalog_cache.price_source(args.region)}")
            return 0
        if args.command == "ls":
            return _ls(args, sys.stdout)
        if args.command == "dashboard":
            from skyward.dashboard import serve

            return serve(args.port, browser=not args.no_browser, out=sys.stdout)
        return _down(args, sys.stdout, sys.stderr)
    except SkywardError as exc:
        print(f"skyward: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("skyward: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
