#!/usr/bin/env python3
"""Run the fault matrix (tests/faults/) and write its counts to docs/reliability.md.

    python3 scripts/reliability.py            # run it, then write the page
    python3 scripts/reliability.py --from X   # write the page from a JUnit XML report X

The page lists every case (provider x phase x exit path) with its outcome, and the counts:
cases tried, cases clean (nothing left, the right node named). Needs root for the SSH test
hosts, as the suite does.
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import sys
import tempfile
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reliability.md"
sys.path.insert(0, str(ROOT))

from tests.faults import test_clusters as clusters  # noqa: E402
from tests.faults import test_dashboard as dashboard  # noqa: E402
from tests.faults import test_managed as managed  # noqa: E402
from tests.faults import test_preemption as preemption  # noqa: E402
from tests.faults import test_state as state  # noqa: E402
from tests.faults.test_matrix import CASES, IDLE_TIMEOUT, PATHS, SILENT_ENDS_WITHIN, WATCHDOG  # noqa: E402

TEST = "test_every_exit_path_leaves_nothing_and_names_the_node"
CLUSTER_TEST = "test_a_named_cluster_ends_up_attachable_or_gone"
PREEMPTION_TEST = "test_a_spot_notice_during_a_task_then_every_exit_path"
STATE_TEST = "test_many_processes_opening_the_state_at_once_all_succeed"
DASHBOARD_TEST = "test_the_dashboard_through_a_fault"


MARK = {"clean": "clean", "failed": "**FAILED**", "skipped": "skipped", None: "not run"}


def tally(results: dict[str, str], cases: list[str] | tuple[str, ...]) -> tuple[int, int]:
    """How many of ``cases`` ran (clean or failed), and how many of those were clean."""
    tried = sum(1 for c in cases if results.get(c) in ("clean", "failed"))
    return tried, sum(1 for c in cases if results.get(c) == "clean")


def outcomes(report: Path, test: str = TEST) -> dict[str, str]:
    """Case id -> "clean" | "failed" | "skipped", from a JUnit XML report."""
    found: dict[str, str] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = case.get("name", "")
        if not name.startswith(test + "["):
            continue
        ident = name[len(test) + 1:-1]
        if case.find("skipped") is not None:
            found[ident] = "skipped"
        elif case.find("failure") is not None or case.find("error") is not None:
            found[ident] = "failed"
        else:
            found[ident] = "clean"
    return found


def cluster_rows(results: dict[str, str]) -> list[str]:
    """The named clusters' table: each case's outcome (what it must leave) and result."""
    mark = MARK
    words = {"up": "up, same workers", "restarted": "up, workers restarted", "gone": "gone"}
    paths = list(dict.fromkeys(p for ps in clusters.PATHS.values() for p in ps))
    tried, clean = tally(results, [c.id for c in clusters.CASES])
    lines = [
        "## Named clusters",
        "",
        "A named cluster (`sky.ComputePool(name=...)`, `skyward launch -c`) outlives its client, so",
        "its cases check the other half of the promise: every exit path of the program leaves the",
        "cluster either up and attachable (with its slots free: the departed client's tasks were",
        "cancelled) or gone, and `skyward down` then leaves no process on any host",
        "(`tests/faults/test_clusters.py`).",
        "",
        f"**{clean} of {tried} cases clean** ({len(clusters.CASES)} in the matrix). Each cell: what",
        "the cluster must be after the exit path, then the result.",
        "",
        "| provider | phase | " + " | ".join(paths) + " |",
        "| --- | --- | " + " | ".join("---" for _ in paths) + " |",
    ]
    for provider in ("local", "ssh"):
        for phase in clusters.PATHS:
            cells = []
            for path in paths:
                case = next((c for c in clusters.CASES if c.id == f"{provider}-{phase}-{path}"), None)
                if case is None:
                    cells.append("")
                    continue
                outcome = words[clusters.OUTCOME.get((phase, path), "up")]
                cells.append(f"{outcome}: {mark[results.get(case.id)]}")
            lines.append(f"| {provider} | {phase} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "*creating*: the cluster is new and a plugin's `around_app` holds its first start (the",
        "client dies before the cluster is up: its workers end when their first client goes, and",
        "the record left as INIT is what `skyward down NAME` removes); *attached*: the program",
        "attached to a cluster that is up and a task runs on every node. Also tested there: an",
        "autostop that fires as clients attach never fails an attach (Local and SSH).",
        "",
    ]
    return lines


def preemption_rows(results: dict[str, str]) -> list[str]:
    """The spot preemption cases: a notice during a task, then each exit path."""
    mark = MARK
    tried, clean = tally(results, preemption.PATHS)
    cells = [mark[results.get(p)] + (" (down)" if p == "SIGKILL" and results.get(p) == "clean" else "")
             for p in preemption.PATHS]
    return [
        "## Spot preemption notices",
        "",
        "A spot interruption notice reaches node 1 of a 2-node AWS spot pool while a task runs",
        "(moto's EC2, the instances the SSH test hosts, a stand-in instance metadata service at",
        "169.254.169.254 in node 1's host), then the program ends by each exit path",
        "(`tests/faults/test_preemption.py`). Each case checks that the task's `sky.on_preempt`",
        "callback ran on node 1 (and not on node 0, which had no notice), that the program was",
        "told (`NodePreempting` for node 1), that the program said what the exit path must say,",
        "and that nothing of the pool is left on any host or in EC2 (with the client killed, after",
        "`skyward down --all`, as above).",
        "",
        f"**{clean} of {tried} cases clean** ({len(preemption.PATHS)} in the matrix).",
        "",
        "| provider | phase | " + " | ".join(preemption.PATHS) + " |",
        "| --- | --- | " + " | ".join("---" for _ in preemption.PATHS) + " |",
        "| aws (spot) | notice during a task | " + " | ".join(cells) + " |",
        "",
        "*return*: node 1's task returns once its callback has saved a checkpoint; *exception*: it",
        "raises after saving it (the error names node 1); *SIGINT*, *SIGKILL*: the program is",
        "interrupted or killed while both tasks still run, after the notice.",
        "",
    ]


def state_rows(results: dict[str, str]) -> list[str]:
    """The cluster state's case: many processes opening it at once, the database new or not."""
    mark = MARK
    tried, clean = tally(results, state.CASES)
    return [
        "## Cluster state under contention",
        "",
        "The clusters this machine knows live in one SQLite database (`state.db` under",
        "`SKYWARD_HOME`) that every client and `skyward` command opens; no access may fail because",
        f"another process holds it. {state.PROCESSES} processes, released together, each record a cluster,",
        "attach to it (hold it, record it UP), read it back and list every cluster, round after",
        "round, each round with a database of its own: made as they all open it (*new*) or made",
        "before (*existing*). No call may fail and every record must be there",
        "(`tests/faults/test_state.py`). Before the database was made ready once, at creation, and",
        "an access tried again on \"database is locked\", 9 runs of 10 of *new* (50 rounds then)",
        "had a process fail so.",
        "",
        f"**{clean} of {tried} cases clean** ({len(state.CASES)} in the matrix).",
        "",
        "| processes | " + " | ".join(f"{c} ({state.ROUNDS[c]} rounds)" for c in state.CASES) + " |",
        "| --- | " + " | ".join("---" for _ in state.CASES) + " |",
        f"| {state.PROCESSES} | " + " | ".join(mark[results.get(c)] for c in state.CASES) + " |",
        "",
    ]


def dashboard_rows(results: dict[str, str]) -> list[str]:
    """``skyward dashboard``'s cases: its server killed, a node lost, a cluster downed, as pages watch."""
    tried, clean = tally(results, dashboard.CASES)
    return [
        "## Dashboard",
        "",
        "`skyward dashboard` over real Local clusters, asked as its pages ask, while a fault happens",
        "(`tests/faults/test_dashboard.py`). In every case no answer is a 500, the clusters and jobs",
        "are what they would be without the dashboard, and nothing is left behind. *server-killed*:",
        "the server is SIGKILLed while a job's log page follows the log; the job and its cluster go",
        "on, nothing the server started is left, and a new server on the same port goes on from the",
        "offsets the page kept, no line lost or repeated. *node-lost*: node 1's worker of a 2-node",
        "cluster is SIGKILLed while the cluster's page is open; the page shows the cluster INIT (as",
        "`skyward status` does), node 1 lost and node 0 up with its figures. *cluster-downed*:",
        "`skyward down` from the command line while the cluster's page and its job's log page are",
        "open; both show it gone, and the job's processes end with it.",
        "",
        f"**{clean} of {tried} cases clean** ({len(dashboard.CASES)} in the matrix).",
        "",
        *one_row_table(dashboard.CASES, results),
        "",
    ]


def one_row_table(cases: list[str], results: dict[str, str], lead: dict[str, str] | None = None) -> list[str]:
    """A table of one row: the ``lead`` columns (heading: cell), then each case's mark."""
    lead = lead or {}
    cells = [*lead.values(), *(MARK[results.get(c)] for c in cases)]
    return ["| " + " | ".join([*lead, *cases]) + " |", "| " + " | ".join("---" for _ in cells) + " |",
            "| " + " | ".join(cells) + " |"]


def managed_rows(results: dict[str, str]) -> list[str]:
    """The managed jobs' cases: their controller on an SSH test host, a fault mid-job."""
    tried, clean = tally(results, managed.CASES)
    return [
        "## Managed jobs",
        "",
        "A managed job (`sky.jobs.launch`, `skyward jobs launch`) whose controller runs on an SSH test",
        "host (`SKYWARD_JOBS_CONTROLLER` names a one-node cluster there) and whose cluster the",
        "controller makes on another host, through a fault mid-job (`tests/faults/test_managed.py`).",
        "*client-and-controller-killed*: the submitting program is SIGKILLed as soon as it has",
        "printed the job's id, then the controller while the job runs; the next `sky.jobs` call",
        "starts a controller, which takes the job up from its records and sees it end.",
        "*job-host-cut*: the job's host has its link cut while the job runs; the controller finds the",
        "node lost (RECOVERING), tears the old cluster down once it can, launches a new one and the",
        "job ends SUCCEEDED after one recovery. In both the job's result comes back, and afterwards",
        "the controller knows no cluster and no skyward process is left on the job's host. The same",
        "faults with the controller on this machine (Local), and a node's worker SIGKILLed, are in",
        "`tests/test_managed_jobs.py` and `tests/test_managed_calls.py`.",
        "",
        f"**{clean} of {tried} cases clean** ({len(managed.CASES)} in the matrix).",
        "",
        *one_row_table(managed.CASES, results, {"controller": "ssh host 0", "jobs on": "ssh host 1"}),
        "",
    ]


def page(results: dict[str, str], cluster_results: dict[str, str] | None = None,
         preemption_results: dict[str, str] | None = None, state_results: dict[str, str] | None = None,
         dashboard_results: dict[str, str] | None = None, managed_results: dict[str, str] | None = None) -> str:
    mark = MARK
    paths = list(dict.fromkeys([*PATHS["running"], *(p for ps in PATHS.values() for p in ps)]))
    tried, clean = tally(results, [c.id for c in CASES])
    by_down = sum(1 for c in CASES if results.get(c.id) == "clean" and c.left_to_watchdog)
    lines = [
        "# Reliability",
        "",
        "Every exit path of a program using a pool, on each provider, in each phase of the pool's",
        "life, must leave no process of the pool on any host (no worker, no process a task started,",
        "however detached, no bootstrap or setup command) and, where it is an error, name the node",
        "it came from. The fault matrix (`tests/faults/`) tries each case in a program of its own",
        "and checks both; it runs with the rest of the suite on every submission. This page is",
        "written by `python3 scripts/reliability.py` from its last run.",
        "",
        f"**{clean} of {tried} cases clean** ({len(CASES)} in the matrix, {by_down} of them "
        f"\"clean (down)\": see AWS below; run {datetime.date.today().isoformat()}).",
        "",
        "| provider | phase | " + " | ".join(paths) + " |",
        "| --- | --- | " + " | ".join("---" for _ in paths) + " |",
    ]
    for provider in ("local", "ssh", "aws"):
        for phase, phase_paths in PATHS.items():
            cells = []
            for path in paths:
                case = next((c for c in CASES if c.id == f"{provider}-{phase}-{path}"), None)
                cell = "" if case is None else mark[results.get(case.id)]
                cells.append(f"{cell} (down)" if cell == "clean" and case and case.left_to_watchdog else cell)
            if any(cells):
                lines.append(f"| {provider} | {phase} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "The phases: *preparing* (the image's setup is running on the hosts), *starting* (a",
        "plugin's `around_app` hook is running), *running* (a task is running; it has started a",
        "daemon and a process in a session of its own), *teardown* (a plugin's exit hook is",
        "running); for elastic pools, *scaling* (`nodes=(1, 2)`: queued tasks hold node 0 while a",
        "scale-up's node 1 is starting, its `around_app` holding) and *replaced* (`nodes=(2, 2)`:",
        "node 1's worker was killed, a broadcast with `retries` runs again on its replacement and",
        "holds). A scale-up under way is ended by teardown too: its starting workers killed, its",
        "machines released. The exit paths: the program returns or raises (a task or hook fails on node",
        "1), is interrupted (SIGINT, as Ctrl-C), terminated (SIGTERM) or killed (SIGKILL); node",
        "1's worker is killed; node 1 goes silent while the program waits in a broadcast, a",
        "`gather` (`-gather`) or `>>` (`-run`): its host is cut off (`link-cut`: its link taken",
        "down) or, on Local, its worker is stopped (`stopped`: SIGSTOP). A silent node must be",
        f"named, and the program ended, within {SILENT_ENDS_WITHIN:g} s (idle_timeout {IDLE_TIMEOUT:g} s).",
        "",
        *textwrap.wrap("AWS runs against moto's EC2 server whose instances are the SSH test hosts; after "
                       "each case no instance, key pair or security group may be left either. With the "
                       "client killed outright (the SIGKILL column, \"clean (down)\") nothing can "
                       "release them but the instances' own watchdog. " + WATCHDOG, 90, break_on_hyphens=False),
        "",
        "Not in the matrix, and why:",
        "",
        "- AWS *replaced*: a replacement instance on moto needs an address the two test hosts do",
        "  not have; a replaced node on AWS is tested in `tests/test_aws_elastic.py` (its instance",
        "  terminated alone, the new one running).",
        "- A host unreachable from the start: `tests/test_ssh_errors.py` and the jump-host test",
        "  in `tests/test_ssh.py`.",
        "- A worker's keepers killed (not an exit path of the program; tested in",
        "  `tests/contract/test_lifecycle.py`, on Local and SSH). The worker runs under two",
        "  subreapers, the guard and below it the keeper: either one SIGKILLed, the other ends",
        "  the worker and every process of its tree at once, detached ones started with an",
        "  environment of their own included. Both killed at once (`kill -9` of the worker's",
        "  group): teardown ends whatever still carries the worker's `SKYWARD_TREE=<id>`. A",
        "  detached process started with an environment of its own outlives that, and so does",
        "  every detached one if the client is killed at the same time.",
        "- NCCL is untested. No machine these tests have run on has a GPU, so the torch plugin's",
        "  NCCL backend, its `NCCL_SOCKET_IFNAME` pinning and DDP over CUDA have never run; every",
        "  DDP test uses gloo on CPU. (What is tested without a GPU: asking for NCCL where there is",
        "  no CUDA fails at start naming the plugin, `tests/test_ddp.py`.)",
        "",
        *cluster_rows(cluster_results or {}),
        *preemption_rows(preemption_results or {}),
        *state_rows(state_results or {}),
        *dashboard_rows(dashboard_results or {}),
        *managed_rows(managed_results or {}),
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--from", dest="report", type=Path, help="a JUnit XML report of tests/faults")
    args = parser.parse_args()
    report = args.report
    if report is None:
        report = Path(tempfile.mkdtemp()) / "faults.xml"
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/faults",
                        f"--junitxml={report}"], cwd=ROOT, check=False)
    PAGE.write_text(page(outcomes(report), outcomes(report, CLUSTER_TEST), outcomes(report, PREEMPTION_TEST),
                         outcomes(report, STATE_TEST), outcomes(report, DASHBOARD_TEST),
                         outcomes(report, managed.TEST)))
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
