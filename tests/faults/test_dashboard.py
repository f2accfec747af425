"""``skyward dashboard`` through faults, over real Local clusters, asked as its pages ask (plain
HTTP, with the cookie the printed URL sets): no answer is ever a 500, the clusters and jobs are
what they would be without the dashboard, and it leaves nothing behind.

* ``server-killed``: the server is SIGKILLed while a job's log page follows the log. The job and
  the cluster go on; nothing the server started is left; a new server on the same port serves
  the page, and from the offsets the page kept the log goes on with no line lost or repeated.
* ``node-lost``: the worker of node 1 of a 2-node cluster is SIGKILLed while its page is open.
  Within a few refreshes the page shows the cluster INIT (as ``skyward status`` does), node 1
  lost and node 0 still up with its figures, and its timeline has the node lost; ``skyward down``
  then ends the rest.
* ``cluster-downed``: the cluster is ended with ``skyward down`` while its page and its job's log
  page are open. They show it gone (an error saying so, with its timeline ending in its down,
  never a 500), and the job's processes are gone.

``scripts/reliability.py`` puts the outcomes on docs/reliability.md.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from skyward.clusters import jobs, manage
from tests.conftest import free_port, pid_alive, wait_gone
from tests.leftovers import cluster_home
from tests.test_cluster_cli import ROOT, sky, task
from tests.test_dashboard import Board, ask, started, wait_for

CASES = ("server-killed", "node-lost", "cluster-downed")
#: The job: prints its pid, then ``tick N`` every 0.05 s, N counting up from 1.
TICKER = """\
name: ticker
run: |
  echo $$ > "$PIDS/job-$SKYPILOT_NODE_RANK.pid"
  i=0
  while true; do i=$((i + 1)); echo "tick $i"; sleep 0.05; done
"""


def serve(work: Path, port: int) -> Board:
    server = subprocess.Popen([sys.executable, "-m", "skyward.cli", "dashboard", "--port", str(port), "--no-browser"],
                              cwd=work, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    return Board(port, started(server).split("token=")[1], work, server)


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return found


class Codes:
    """Every status the server answered during the case (a page's polls included)."""

    def __init__(self) -> None:
        self.seen: set[int] = set()

    def get(self, board: Board, path: str) -> tuple[int, str]:
        code, text = ask(board, "GET", path, token=board.token)
        self.seen.add(code)
        return code, text


def ticks(answer: dict) -> list[int]:
    return [int(x["text"].split()[1]) for x in answer["lines"] if x["text"].startswith("tick ")]


def log(codes: Codes, board: Board, name: str, seen: dict[str, int]) -> dict:
    import json

    text = ",".join(f"{n}:{c}" for n, c in seen.items())
    code, answer = codes.get(board, f"/api/clusters/{name}/jobs/1/log?seen={text}")
    assert code == 200, answer
    return json.loads(answer)


def launch(work: Path, name: str, nodes: int = 1) -> None:
    task(work, TICKER, "ticker.yaml")
    done = sky("launch", "-c", name, "-d", "--num-nodes", str(nodes), "ticker.yaml", "--env",
               f"PIDS={work}", cwd=work)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("case", CASES)
def test_the_dashboard_through_a_fault(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    codes = Codes()
    port = free_port()
    with cluster_home(monkeypatch, "skyf"):
        name = {"server-killed": "k", "node-lost": "n", "cluster-downed": "d"}[case]
        launch(tmp_path, name, 2 if case == "node-lost" else 1)
        board = serve(tmp_path, port)
        try:
            first = wait_for(lambda: (a := log(codes, board, name, {}))["lines"] and a, 30, "the first ticks")
            if case == "server-killed":
                left = children(board.server.pid)
                def follow() -> None:
                    with contextlib.suppress(OSError):  # (its server killed as it asks)
                        codes.get(board, f"/api/clusters/{name}/jobs/1/log")

                following = threading.Thread(target=follow)
                following.start()
                board.server.send_signal(signal.SIGKILL)
                board.server.wait(30)
                following.join(60)
                assert wait_gone(left, 15) == [], "a process the killed server started is left"
                assert jobs.job(name, 1).status == "RUNNING"  # type: ignore[union-attr]
                assert [s.status for s in manage.status([name])] == ["UP"]
                board = serve(tmp_path, port)  # (the same port: nothing holds it)
                later = wait_for(lambda: (a := log(codes, board, name, first["seen"]))["lines"] and a, 30, "ticks")
                assert ticks(later)[0] == ticks(first)[-1] + 1  # nothing lost, nothing repeated
                assert ticks(later) == list(range(ticks(later)[0], ticks(later)[-1] + 1))
            elif case == "node-lost":
                record = manage.ClusterStore().get(name)
                assert record is not None
                os.kill(record.workers[1][0], signal.SIGKILL)

                def lost() -> dict | None:
                    code, text = codes.get(board, f"/api/clusters/{name}")
                    answer = json.loads(text)
                    states = [n.get("state") for n in answer.get("nodes", [])]
                    return answer if code == 200 and states == ["up", "lost"] else None

                shown = wait_for(lost, 30, "node 1 shown lost, node 0 up")
                assert shown["status"] == "INIT" and shown["nodes"][0]["cpu"] >= 0
                assert {"kind": "node", "text": "node 1 lost: its worker does not answer"} in [
                    {k: e[k] for k in ("kind", "text")} for e in shown["events"]]
            else:
                pid = int((tmp_path / "job-0.pid").read_text())
                assert codes.get(board, f"/api/clusters/{name}")[0] == 200
                assert sky("down", name, "-y", cwd=tmp_path).returncode == 0
                code, text = codes.get(board, f"/api/clusters/{name}")
                gone = json.loads(text)
                assert (code, gone["error"], gone["gone"]) == (503, f"no cluster named {name}", True)
                assert gone["events"][0]["kind"] == "down"  # (its timeline says how it ended)
                code, text = codes.get(board, f"/api/clusters/{name}/jobs/1/log?seen=0:{first['seen']['0']}")
                assert code == 503 and name in json.loads(text)["error"]
                assert codes.get(board, "/api/clusters") == (200, "[]")
                assert wait_gone([pid], 15) == [], "the job outlived its cluster"
            assert 500 not in codes.seen and board.server.poll() is None
        finally:
            board.server.terminate()
            board.server.wait(30)
        if case != "cluster-downed":
            workers = [p for p, _ in manage.ClusterStore().get(name).workers]  # type: ignore[union-attr]
            assert sky("down", name, "-y", cwd=tmp_path).returncode == 0
            assert wait_gone(workers, 15) == [] and manage.status() == []
    assert not pid_alive(board.server.pid)
