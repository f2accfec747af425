"""The console: a subscriber of the pool's events, in plain, live and off modes."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone

import pytest
from rich.console import Console as RichConsole

import skyward as sky
from skyward import events as ev
from skyward.console import Console
from skyward.console.live import render as render_view
from skyward.console.state import ConsoleState
from skyward.testing import console_backlog

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture(autouse=True)
def _no_console_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SKYWARD_CONSOLE", raising=False)
    monkeypatch.delenv("SKYWARD_CONSOLE_VERBOSE", raising=False)


def startup(c: Console, nodes: int = 2, *, logs: bool = True) -> None:
    """What a 2-node SSH pool emits from start to ready."""
    c(ev.PoolStarting("p1", nodes, "ssh"))
    for n in range(nodes):
        c(ev.NodeStage(n, "provisioning"))
    for n in range(nodes):
        c(ev.NodeStage(n, "bootstrapping", f"10.0.0.{n + 1}"))
        if logs:
            c(ev.NodeLog(n, f"installing numpy on {n}"))
            c(ev.NodeLog(n, f"bootstrap done on {n}"))
    for n in range(nodes):
        c(ev.NodeStage(n, "starting", f"10.0.0.{n + 1}"))
    for n in range(nodes):
        c(ev.NodeStage(n, "ready"))
    c(ev.PoolReady("p1", nodes, 1.5))


def work_and_stop(c: Console, nodes: int = 2) -> None:
    """Each node runs one task that prints; node 1's second task fails; then the pool stops."""
    for n in range(nodes):
        c(ev.TaskStarted(n, n, "f"))
        c(ev.TaskOutput(n, n, "stdout", f"hello from {n}"))
        c(ev.TaskOutput(n, n, "stderr", f"warning from {n}"))
        c(ev.TaskFinished(n, n, "f", True, 0.1))
    c(ev.TaskStarted(10, 1, "g"))
    c(ev.TaskFinished(10, 1, "g", False, 0.1))
    for n in range(nodes):
        c(ev.NodeStage(n, "stopping"))
    for n in range(nodes):
        c(ev.NodeStage(n, "stopped"))
    c(ev.PoolStopped("p1", 0.2, True))


def strip(text: str) -> str:
    return ANSI.sub("", text)


# -- plain mode --------------------------------------------------------------------------------
def test_plain_mode_logs_stages_summaries_and_output(capsys: pytest.CaptureFixture[str]) -> None:
    c = Console(mode="plain")
    startup(c)
    work_and_stop(c)
    out, err = capsys.readouterr()
    assert out == "[node 0] hello from 0\n[node 1] hello from 1\n"
    lines = err.splitlines()
    assert "[node 0] warning from 0" in lines and "[node 1] warning from 1" in lines
    status = [ln for ln in lines if ln.startswith("skyward:")]
    shapes = [re.sub(r"\(\d+\.\ds\)", "(T)", re.sub(r"up \d+\.\ds", "up T", ln)) for ln in status]
    assert shapes == [
        "skyward: node 0 provisioning (T)",
        "skyward: node 1 provisioning (T)",
        "skyward: node 0 bootstrapping 10.0.0.1 (T)",
        "skyward: node 1 bootstrapping 10.0.0.2 (T)",
        "skyward: node 0 ready (T)",
        "skyward: node 1 ready (T)",
        "skyward: pool p1 ready: 2 nodes on ssh in 1.5s",
        "skyward: node 0 stopped (T)",
        "skyward: node 1 stopped (T)",
        "skyward: pool p1 stopped: 3 tasks (2 done, 1 failed), up T",
    ]
    # quiet: no starting/stopping lines, no bootstrap log of healthy nodes
    assert "installing numpy" not in err and "starting" not in err and "stopping" not in err


def test_plain_mode_shows_the_log_of_a_lost_node(capsys: pytest.CaptureFixture[str]) -> None:
    c = Console(mode="plain")
    startup(c, logs=False)
    c(ev.TaskStarted(1, 1, "f"))
    c(ev.NodeLog(1, "Segmentation fault (core dumped)"))  # after ready: stray output, shown
    c(ev.NodeStage(1, "stopping"))
    c(ev.NodeLog(1, "worker: exiting"))  # while stopping: kept for the failure report
    c(ev.NodeStage(1, "lost", "worker exited while running 1 task(s)"))
    c(ev.PoolStopped("p1", 0.1, False))
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert "[node 1] Segmentation fault (core dumped)" in lines
    lost = lines.index(next(ln for ln in lines if ln.startswith("skyward: node 1 lost")))
    assert lines[lost].endswith(": worker exited while running 1 task(s)")
    assert lines[lost + 1] == "[node 1] worker: exiting"
    assert re.search(r"1 task \(0 done, 1 failed\), up \d+\.\ds, node 1 lost, teardown incomplete$", lines[-1])


def test_plain_mode_shows_the_log_of_a_node_that_never_came_up(capsys: pytest.CaptureFixture[str]) -> None:
    c = Console(mode="plain")
    c(ev.PoolStarting("p2", 2, "ssh"))
    for n in range(2):
        c(ev.NodeStage(n, "bootstrapping", "h"))
    for i in range(30):
        c(ev.NodeLog(0, f"pip line {i}"))
    c(ev.NodeLog(0, "ERROR: no matching distribution"))
    c(ev.NodeLog(1, "fine so far"))
    c(ev.PoolStopped("p2", 0.1, True))
    err = capsys.readouterr().err
    assert "[node 0] ERROR: no matching distribution" in err
    assert "[node 0] pip line 29" in err and "[node 0] pip line 0\n" not in err  # only the tail
    assert "[node 1] fine so far" in err
    assert err.splitlines()[-1].startswith("skyward: pool p2 stopped: no tasks")


def test_plain_mode_says_every_change_of_an_elastic_pool(capsys: pytest.CaptureFixture[str]) -> None:
    c = Console(mode="plain")
    startup(c, nodes=1, logs=False)
    for stage in ("provisioning", "starting", "ready"):
        c(ev.NodeStage(1, stage))
    c(ev.NodeAdded(1, "scale-up: 12 tasks waiting"))
    c(ev.NodeStage(1, "stopping"))
    c(ev.NodeStage(1, "stopped"))
    c(ev.NodeRemoved(1, "idle 60s"))
    c(ev.NodeStage(0, "lost", "worker exited (killed by SIGKILL)"))
    c(ev.TaskRetried("f", 0, 2, 3))
    c(ev.NodeRemoved(0, "lost: worker exited (killed by SIGKILL); replacing"))
    c(ev.NodeStage(0, "ready"))  # the replacement, under the same number
    c(ev.NodeAdded(0, "replacement"))
    c(ev.PoolStopped("p1", 0.1, True))
    lines = [re.sub(r" \(\d+\.\ds\)$", "", ln) for ln in capsys.readouterr().err.splitlines()]
    for line in ("skyward: node 1 added (scale-up: 12 tasks waiting)", "skyward: node 1 removed (idle 60s)",
                 "skyward: node 0 lost; replacing", "skyward: task f retried after node 0 was lost (attempt 2 of 3)",
                 "skyward: node 0 added (replacement)"):
        assert line in lines, lines
    assert "lost" not in lines[-1]  # the replacement came up: the pool did not end smaller


def test_a_preemption_notice_gets_one_line_with_its_node_action_and_time(capsys: pytest.CaptureFixture[str]) -> None:
    c = Console(mode="plain")
    startup(c, logs=False)
    soon = datetime.now(timezone.utc) + timedelta(seconds=100)
    c(ev.NodePreempting(1, None, datetime(2026, 5, 1, 12, 0, 3, tzinfo=timezone.utc), "rebalance"))
    c(ev.NodePreempting(1, "terminate", soon, "interruption"))
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("skyward: node 1:")]
    assert lines[0] == ("skyward: node 1: EC2 recommends a rebalance (at elevated risk of interruption, "
                        "since 12:00:03 UTC)")
    assert re.fullmatch(r"skyward: node 1: spot interruption notice: terminate at \d\d:\d\d:\d\d UTC "
                        r"\(in (1m3\ds|9\d\.\ds|1m40s)\)", lines[1]), lines[1]
    assert len(lines) == 2


def test_verbose_prints_every_log_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKYWARD_CONSOLE_VERBOSE", "1")
    c = Console(mode="plain")
    assert c.verbose
    startup(c)
    err = capsys.readouterr().err
    assert "[node 0] installing numpy on 0\n" in err and "[node 1] bootstrap done on 1\n" in err
    assert not Console(mode="plain", verbose=False).verbose


def test_off_prints_task_output_only(capsys: pytest.CaptureFixture[str]) -> None:
    c = Console(mode="off")
    startup(c)
    work_and_stop(c)
    out, err = capsys.readouterr()
    assert out == "[node 0] hello from 0\n[node 1] hello from 1\n"
    assert err == "[node 0] warning from 0\n[node 1] warning from 1\n"


def test_file_receives_the_status_lines(capsys: pytest.CaptureFixture[str]) -> None:
    log = io.StringIO()
    c = Console(mode="plain", file=log)
    startup(c)
    work_and_stop(c)
    out, err = capsys.readouterr()
    assert "skyward:" not in out + err
    assert "[node 0] hello from 0\n" in out
    assert "skyward: pool p1 ready" in log.getvalue() and "skyward: pool p1 stopped" in log.getvalue()


# -- choosing the mode ---------------------------------------------------------------------------
class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_mode_follows_the_terminal_and_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Console().mode == "plain"  # pytest captures stdout: not a terminal
    monkeypatch.setattr(sys, "stdout", FakeTTY())
    monkeypatch.setenv("TERM", "xterm-256color")
    assert Console().mode == "live"
    monkeypatch.setenv("TERM", "dumb")
    assert Console().mode == "plain"
    for value, mode in [("off", "off"), ("PLAIN", "plain"), (" live ", "live"), ("auto", "plain"), ("", "plain")]:
        monkeypatch.setenv("SKYWARD_CONSOLE", value)
        assert Console().mode == mode, value
    monkeypatch.setenv("SKYWARD_CONSOLE", "off")
    assert Console(mode="plain").mode == "plain"  # an explicit mode wins over the variable


def test_unknown_mode_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKYWARD_CONSOLE", "fancy")
    with pytest.raises(sky.ConfigError, match="SKYWARD_CONSOLE"):
        Console()
    with pytest.raises(sky.ConfigError, match="SKYWARD_CONSOLE"):
        sky.ComputePool(nodes=1)  # before anything starts
    monkeypatch.delenv("SKYWARD_CONSOLE")
    with pytest.raises(sky.ConfigError, match="mode"):
        Console(mode="loud")  # type: ignore[arg-type]


def test_plain_console_does_not_import_rich() -> None:
    code = (
        "import sys, skyward, skyward.worker\n"
        "from skyward import events as ev\n"
        "from skyward.console import Console\n"
        "c = Console(mode='plain')\n"
        "c(ev.PoolStarting('p', 1, 'local')); c(ev.NodeStage(0, 'ready')); c(ev.PoolStopped('p', 0.1, True))\n"
        "print('rich' in sys.modules, file=sys.stderr)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "SKYWARD_CONSOLE": ""})
    assert out.stderr.strip().splitlines()[-1] == "False"


# -- live mode -----------------------------------------------------------------------------------
def rich_console(width: int = 100) -> tuple[RichConsole, io.StringIO]:
    buf = io.StringIO()
    return RichConsole(file=buf, force_terminal=True, width=width), buf


class LiveState:
    """A live console's state and view, fed events directly: no live refresh thread."""

    def __init__(self, rc: RichConsole) -> None:
        self.state = ConsoleState(live=True, verbose=False, now=time.monotonic())
        self.rc, self.lock = rc, threading.Lock()

    def apply(self, event: ev.Event, now: float) -> None:
        self.state.apply(event, now)

    def renderable(self) -> object:
        return render_view(self.state, self.lock, self.rc)


def render(c: Console | LiveState, width: int = 100) -> str:
    rc, buf = rich_console(width)
    rc.print(c.renderable())
    return strip(buf.getvalue())


def row(text: str, node: int) -> str:
    return next(ln for ln in text.splitlines() if re.match(rf"\s*{node}\s{{2,}}", ln))


def test_live_view_shows_stage_time_and_log_tail_per_node() -> None:
    rc, _ = rich_console()
    assert Console(rich_console=rc).mode == "live"
    c = LiveState(rc)
    c.apply(ev.PoolStarting("p1", 3, "ssh"), time.monotonic())
    stages: list[ev.Stage] = ["provisioning", "bootstrapping", "starting"]
    for n, stage in enumerate(stages):
        c.apply(ev.NodeStage(n, stage, f"10.0.0.{n + 1}" if n else ""), time.monotonic())
    c.apply(ev.NodeLog(1, "Collecting numpy==2.1"), time.monotonic())
    c.apply(ev.NodeLog(1, "\x1b[32mSuccessfully installed numpy\x1b[0m"), time.monotonic())
    c.apply(ev.NodeLog(2, "worker listening"), time.monotonic())
    text = render(c)
    assert "pool p1" in text and "ssh" in text and "3 nodes" in text and "starting" in text
    assert "provisioning" in row(text, 0)
    assert "bootstrapping" in row(text, 1) and "Successfully installed numpy" in row(text, 1)
    assert "Collecting" not in text  # only the last line
    assert "starting" in row(text, 2) and "worker listening" in row(text, 2) and "10.0.0.3" in row(text, 2)
    assert re.search(r"\d+\.\ds / \d+\.\ds", row(text, 0))
    assert "done" not in text  # no task columns before the pool is ready


def test_live_view_shows_task_counts_after_ready_and_lost_nodes() -> None:
    rc, _ = rich_console()
    c = LiveState(rc)
    now = time.monotonic
    c.apply(ev.PoolStarting("p1", 3, "local"), now())
    for n in range(3):
        c.apply(ev.NodeStage(n, "ready"), now())
    c.apply(ev.PoolReady("p1", 3, 0.4), now())
    for t in range(5):
        c.apply(ev.TaskStarted(t, 0, "f"), now())
    for t in range(3):
        c.apply(ev.TaskFinished(t, 0, "f", t != 2, 0.1), now())
    c.apply(ev.TaskStarted(9, 2, "f"), now())
    c.apply(ev.NodeStage(2, "lost", "no heartbeat for 31s"), now())
    text = render(c)
    header = text.splitlines()[0]
    assert "2/3 ready in 0.4s" in header and "2 running, 2 done, 2 failed" in header
    assert re.search(r"run\s+done\s+failed", text)
    assert re.search(r"ready\s+\S+ / \S+\s+2\s+2\s+1\b", row(text, 0))
    assert re.search(r"ready\s+\S+ / \S+\s+0\s+0\s+0\b", row(text, 1))
    assert re.search(r"lost\s+\S+ / \S+\s+0\s+0\s+1\s+no heartbeat for 31s", row(text, 2))


def test_live_view_collapses_many_nodes() -> None:
    rc = RichConsole(file=io.StringIO(), force_terminal=True, width=100, height=20)
    c = LiveState(rc)
    c.apply(ev.PoolStarting("big", 64, "aws"), time.monotonic())
    for n in range(60):
        c.apply(ev.NodeStage(n, "ready"), time.monotonic())
    for n in range(60, 64):
        c.apply(ev.NodeStage(n, "bootstrapping"), time.monotonic())
    buf = io.StringIO()
    RichConsole(file=buf, force_terminal=True, width=100, height=20).print(c.renderable())
    text = strip(buf.getvalue())
    assert len(text.splitlines()) < 20
    assert "51 more" in text and "47 ready, 4 bootstrapping" in text  # 13 rows + 1 summary row


def test_live_mode_prints_output_above_the_view_and_a_summary_at_the_end(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc, buf = rich_console()
    c = Console(mode="live", rich_console=rc)
    startup(c)
    assert c.showing
    deadline = time.monotonic() + 5  # let the view refresh (later on a loaded machine)
    while time.monotonic() < deadline:
        drawn = strip(buf.getvalue())
        if "bootstrap done on 1" in drawn and "ready" in drawn:
            break
        time.sleep(0.05)
    assert "bootstrap done on 1" in drawn and "ready" in drawn  # the table was drawn
    work_and_stop(c)
    assert not c.showing
    text = strip(buf.getvalue())
    assert "[node 0] hello from 0" in text and "[node 1] hello from 1" in text
    assert "skyward: pool p1 ready: 2 nodes on ssh in 1.5s" in text
    assert "skyward: pool p1 stopped: 3 tasks (2 done, 1 failed)" in text
    assert "skyward: node 0 ready" not in text  # per-node stage lines are the table's job
    # stderr is not a terminal here: task stderr goes to it, not through the view
    out, err = capsys.readouterr()
    assert err == "[node 0] warning from 0\n[node 1] warning from 1\n" and out == ""
    # the view was taken down: another console can go live now
    rc2, _ = rich_console()
    c2 = Console(rich_console=rc2)
    c2(ev.PoolStarting("p3", 1, "local"))
    assert c2.showing
    c2(ev.PoolStopped("p3", 0.0, True))
    assert not c2.showing


def test_live_events_from_many_threads() -> None:
    rc, buf = rich_console()
    c = Console(rich_console=rc)
    startup(c, nodes=4)

    def hammer(node: int) -> None:
        for t in range(200):
            tid = node * 1000 + t
            c(ev.TaskStarted(tid, node, "f"))
            c(ev.TaskOutput(node, tid, "stdout", f"line {t}"))
            c(ev.NodeLog(node, f"diag {t}"))
            c(ev.TaskFinished(tid, node, "f", t % 10 != 0, 0.0))

    threads = [threading.Thread(target=hammer, args=(n,)) for n in range(4)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert time.monotonic() - started < 30 and not any(t.is_alive() for t in threads)
    header = strip(render(c)).splitlines()[0]
    assert "0 running, 720 done, 80 failed" in header
    c(ev.PoolStopped("p1", 0.1, True))
    assert strip(buf.getvalue()).count("] line 199") == 4


# -- with a real pool ----------------------------------------------------------------------------
@sky.compute
def chatty(tag: str) -> int:
    node = sky.instance_info().node
    print(f"{tag} out {node}")
    print(f"{tag} err {node}", file=sys.stderr)
    return node


@sky.compute
def die() -> None:
    os._exit(3)


def test_real_pool_in_plain_mode(capsys: pytest.CaptureFixture[str]) -> None:
    with sky.ComputePool(nodes=2) as pool:
        assert chatty("hi") @ pool == [0, 1]
    out, err = capsys.readouterr()
    assert sorted(out.splitlines()) == ["[node 0] hi out 0", "[node 1] hi out 1"]
    assert "[node 0] hi err 0\n" in err and "[node 1] hi err 1\n" in err
    for n in (0, 1):
        assert re.search(rf"^skyward: node {n} provisioning \(\d+\.\ds\)$", err, re.M)
        assert re.search(rf"^skyward: node {n} ready \(\d+\.\ds\)$", err, re.M)
        assert re.search(rf"^skyward: node {n} stopped \(\d+\.\ds\)$", err, re.M)
    assert re.search(r"^skyward: pool \w+ ready: 2 nodes on local in \d+\.\ds$", err, re.M)
    assert re.search(r"^skyward: pool \w+ stopped: 2 tasks \(2 done, 0 failed\), up \d+\.\ds$", err, re.M)


def test_real_pool_reports_a_lost_node(capsys: pytest.CaptureFixture[str]) -> None:
    with sky.ComputePool(nodes=1) as pool:
        with pytest.raises(sky.WorkerLost):
            die() >> pool
    err = capsys.readouterr().err
    assert re.search(r"^skyward: node 0 lost \(\d+\.\ds\): ", err, re.M)
    assert re.search(r"stopped: 1 task \(0 done, 1 failed\), up \d+\.\ds, node 0 lost$", err, re.M)


def test_a_named_cluster_detaching_says_it_stays_up_not_stopped(capsys: pytest.CaptureFixture[str],
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("SKYWARD_HOME", str(tmp_path))
    with sky.ComputePool(name="detach-words", nodes=1, idle_minutes=5) as pool:
        chatty("hi") >> pool
    err = capsys.readouterr().err
    try:
        assert "it stays up" in err, err
        assert not re.search(r"^skyward: pool \w+ stopped", err, re.M), err  # it did not stop
        assert re.search(r"^skyward: pool \w+ detached: 1 task \(1 done, 0 failed\), up \d+\.\ds$", err, re.M), err
    finally:
        with sky.ComputePool(name="detach-words", console=False) as pool:
            pool.down()


@sky.compute(retries=1)
def lost_once(marker: str) -> int:
    """The first run kills its own worker (as a lost machine would); the retry returns."""
    if not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), 9)
    return 7


def test_a_retried_task_that_succeeded_is_not_counted_as_failed(capsys: pytest.CaptureFixture[str],
                                                                tmp_path) -> None:  # type: ignore[no-untyped-def]
    with sky.ComputePool(nodes=(1, 1)) as pool:
        assert lost_once(str(tmp_path / "marker")) >> pool == 7
        pool.wait_ready(timeout=60)
        assert chatty("after") >> pool == 0
    err = capsys.readouterr().err
    assert "retried after node 0 was lost (attempt 2 of 2)" in err, err
    assert re.search(r"^skyward: pool \w+ stopped: 2 tasks \(2 done, 0 failed\), 1 retried, up \d+\.\ds$", err, re.M), err


def test_a_retry_counts_the_same_whichever_event_comes_first(capsys: pytest.CaptureFixture[str]) -> None:
    for retried_first in (True, False):
        c = Console(mode="plain")
        startup(c, nodes=1, logs=False)
        c(ev.TaskStarted(1, 0, "f"))
        if retried_first:
            c(ev.TaskRetried("f", 0, 2, 2))
        c(ev.NodeStage(0, "lost", "worker exited"))
        if not retried_first:
            c(ev.TaskRetried("f", 0, 2, 2))
        c(ev.NodeStage(0, "ready"))
        c(ev.TaskStarted(2, 0, "f"))
        c(ev.TaskFinished(2, 0, "f", True, 0.1))
        c(ev.PoolStopped("p1", 0.1, True))
        last = capsys.readouterr().err.splitlines()[-1]
        assert re.search(r"stopped: 1 task \(1 done, 0 failed\), 1 retried, up", last), (retried_first, last)


def test_real_pool_with_console_off(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKYWARD_CONSOLE", "off")
    with sky.ComputePool(nodes=2) as pool:
        chatty("quiet") @ pool
    out, err = capsys.readouterr()
    assert sorted(out.splitlines()) == ["[node 0] quiet out 0", "[node 1] quiet out 1"]
    assert sorted(err.splitlines()) == ["[node 0] quiet err 0", "[node 1] quiet err 1"]


def test_real_pool_with_console_false_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    with sky.ComputePool(nodes=1, console=False) as pool:
        chatty("none") >> pool
    assert capsys.readouterr() == ("", "")


def test_real_pool_with_live_forced(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKYWARD_CONSOLE", "live")  # draws even though stdout is not a terminal
    stdout = sys.stdout
    with sky.ComputePool(nodes=2) as pool:
        assert chatty("drawn") @ pool == [0, 1]
        time.sleep(0.3)
    assert sys.stdout is stdout  # the view's redirection of stdout was undone
    out, err = capsys.readouterr()
    text = strip(out)
    assert "[node 0] drawn out 0" in text and "[node 1] drawn out 1" in text
    assert re.search(r"skyward: pool \w+ stopped: 2 tasks \(2 done, 0 failed\)", text)
    assert re.search(r"ready\s+\d", text)  # the table was drawn while the pool ran
    assert "[node 0] drawn err 0" in err


# -- keeping up, true counts, progress lines, markers, logging, Ctrl-C ------------------------------
def test_live_view_never_prints_in_the_thread_that_hands_it_lines_and_prints_them_all() -> None:
    # A connection's reader hands every output line to the console: printing there, line by
    # line (redrawing the view for each), managed ~160 lines/s once. Lines are queued and a
    # flusher prints them in batches (bench/console.py measures the rate; no timing here).
    writers: set[int] = set()
    handing = threading.Event()

    class Recorded(io.StringIO):
        def write(self, text: str) -> int:
            if handing.is_set():
                writers.add(threading.get_ident())
            return super().write(text)

    buf = Recorded()
    rc = RichConsole(file=buf, force_terminal=True, width=100)
    c = Console(rich_console=rc)
    startup(c)
    lines = 20_000
    handing.set()
    for i in range(lines):  # what a connection's reader thread does per output line
        c(ev.TaskOutput(i % 2, 1, "stdout", f"line {i}"))
    handing.clear()
    c(ev.PoolStopped("p1", 0.1, True))
    assert threading.get_ident() not in writers
    text = strip(buf.getvalue())
    assert text.count("] line ") == lines and "[node 1] line 19999" in text


def test_live_view_prints_in_batches_while_the_pool_runs() -> None:
    rc, buf = rich_console()
    c = Console(rich_console=rc)
    startup(c)
    c(ev.TaskOutput(0, 1, "stdout", "early line"))
    deadline = time.monotonic() + 5
    while "early line" not in strip(buf.getvalue()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert "early line" in strip(buf.getvalue())  # shown without waiting for the pool to stop
    c(ev.PoolStopped("p1", 0.1, True))


def test_running_counts_only_what_the_slots_hold_and_queued_tasks_apart() -> None:
    rc, _ = rich_console()
    c = LiveState(rc)
    now = time.monotonic
    c.apply(ev.PoolStarting("p1", 2, "local", concurrency=1), now())
    for n in range(2):
        c.apply(ev.NodeStage(n, "ready"), now())
    c.apply(ev.PoolReady("p1", 2, 0.2), now())
    for t in range(5):
        c.apply(ev.TaskStarted(t, 0, "f"), now())
    c.apply(ev.TaskStarted(9, 1, "f"), now())
    text = render(c, width=140)
    assert "2 running, 4 queued, 0 done, 0 failed" in text.splitlines()[0]
    assert re.search(r"ready\s+\S+ / \S+\s+1\s+0\s+0\b", row(text, 0))


def test_a_batch_of_many_tasks_gets_a_progress_bar_with_rate_and_eta() -> None:
    rc, _ = rich_console()
    c = Console(rich_console=rc)
    startup(c)
    for t in range(40):
        c(ev.TaskStarted(t, t % 2, "f"))
    for t in range(10):
        c(ev.TaskFinished(t, t % 2, "f", True, 0.01))
    bar = next(ln for ln in render(c).splitlines() if ln.startswith("tasks "))
    assert re.search(r"10/40 · [\d,]+/s · ETA ", bar), bar
    c(ev.PoolStopped("p1", 0.1, True))


def test_cancelled_tasks_are_counted_as_cancelled(capsys: pytest.CaptureFixture[str]) -> None:
    c = Console(mode="plain")
    startup(c, logs=False)
    c(ev.TaskStarted(1, 0, "f"))
    c(ev.TaskFinished(1, 0, "f", False, 0.1, cancelled=True))
    c(ev.TaskStarted(2, 1, "f"))
    c(ev.NodeStage(1, "stopping"))
    c(ev.NodeStage(1, "stopped"))  # stopped on purpose with a task on it: cancelled, not failed
    c(ev.PoolStopped("p1", 0.1, True))
    assert re.search(r"stopped: 2 tasks \(0 done, 0 failed, 2 cancelled\)", capsys.readouterr().err)


def test_an_interrupted_pool_says_so_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    c = Console(mode="off")  # even with the console off
    startup(c, logs=False)
    c(ev.TaskStarted(1, 0, "f"))
    c(ev.PoolStopped("p1", 0.1, True, interrupted=True))
    out, err = capsys.readouterr()
    assert (out, err) == ("", "skyward: interrupted: pool p1 stopped, nothing left running (1 task cancelled)\n")


def test_progress_lines_are_one_updating_line_per_node(capsys: pytest.CaptureFixture[str]) -> None:
    c = Console(mode="plain")
    startup(c, logs=False)
    c(ev.TaskStarted(1, 0, "f"))
    for i in range(1, 101):  # tqdm redraws with carriage returns; each flush arrives as a line
        c(ev.TaskOutput(0, 1, "stderr", f"\r{i:3d}%|{'#' * (i // 10)}| {i}/100"))
    c(ev.TaskOutput(0, 1, "stdout", "a line\r\n".rstrip("\n")))  # a CRLF line end is not a redraw
    c(ev.TaskFinished(1, 0, "f", True, 0.5))
    out, err = capsys.readouterr()
    shown = [ln for ln in err.splitlines() if ln.startswith("[node 0]")]
    assert shown == ["[node 0]   1%|| 1/100", "[node 0] 100%|##########| 100/100"]
    assert out == "[node 0] a line\r\n"


def test_live_view_shows_progress_in_the_node_row_and_the_final_state_once() -> None:
    rc, buf = rich_console()
    c = Console(rich_console=rc)
    startup(c)
    c(ev.TaskStarted(1, 1, "f"))
    for i in range(1, 51):
        c(ev.TaskOutput(1, 1, "stdout", f"\repoch {i}/50"))  # (stderr is not on this screen)
    assert "epoch 50/50" in row(render(c), 1)
    c(ev.TaskFinished(1, 1, "f", True, 0.5))
    c(ev.PoolStopped("p1", 0.1, True))
    text = strip(buf.getvalue())
    assert "[node 1] epoch 49/50" not in text  # the states in between are never printed as lines
    assert text.count("[node 1] epoch 50/50") == 1


def test_bootstrap_step_markers_are_never_shown(capsys: pytest.CaptureFixture[str]) -> None:
    c = Console(mode="plain", verbose=True)
    c(ev.PoolStarting("p1", 1, "ssh"))
    c(ev.NodeLog(0, "::step:: pip"))
    c(ev.NodeLog(0, "::warm:: environment abc123 reused"))
    rc, _ = rich_console()
    live = LiveState(rc)
    live.apply(ev.PoolStarting("p1", 1, "ssh"), time.monotonic())
    live.apply(ev.NodeLog(0, "::step:: uv"), time.monotonic())
    err = capsys.readouterr().err
    assert "[node 0] step pip" in err and "[node 0] environment abc123 reused" in err
    assert "::" not in err and "::" not in render(live) and "step uv" in render(live)


def test_logging_records_go_above_the_live_view(capsys: pytest.CaptureFixture[str]) -> None:
    import logging

    original = sys.stdout
    handler = logging.StreamHandler(original)
    logger = logging.getLogger("skyward.tests.client")
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    try:
        c = Console(mode="live")  # drawn on this process's stdout: its handlers are routed
        startup(c)
        assert handler.stream is not original
        logger.info("client record while live")
        work_and_stop(c)
        assert handler.stream is original  # given back when the view goes
    finally:
        logger.removeHandler(handler)
    out = strip(capsys.readouterr().out)
    assert out.count("client record while live") == 1


INTERRUPTED = """
import sys, time
import skyward as sky

@sky.compute
def wait() -> None:
    print("task running", flush=True)
    time.sleep(60)

with sky.ComputePool(nodes=2, console={console}) as pool:
    print("pool open", flush=True)
    wait() @ pool
"""


@pytest.mark.parametrize("console", ["True", "False"])
def test_ctrl_c_prints_one_line_and_no_traceback(tmp_path, console: str) -> None:
    import signal

    script = tmp_path / "interrupted.py"
    script.write_text(INTERRUPTED.format(console=console))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this checkout's skyward
    env = {**os.environ, "SKYWARD_CONSOLE": "plain", "PYTHONPATH": root}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if "pool open" in line or not line:
            break
    time.sleep(1.0)  # both tasks running (with a console, their "task running" lines show it)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode in (-signal.SIGINT, 130), err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    notes = [ln for ln in err.splitlines() if "interrupted" in ln]
    assert len(notes) == 1 and re.match(r"skyward: interrupted: pool \w+ stopped, nothing left running", notes[0]), err
    if console == "True":
        assert notes[0].endswith("(2 tasks cancelled)")


def test_tqdm_in_a_task_is_one_line_per_node_not_one_per_refresh(capsys: pytest.CaptureFixture[str]) -> None:
    @sky.compute
    def loop() -> int:
        from tqdm import tqdm

        total = 0
        for i in tqdm(range(200), mininterval=0, miniters=1, file=sys.stderr, ascii=True):
            total += i
            time.sleep(0.001)
        return total

    with sky.ComputePool(nodes=2) as pool:
        assert loop() @ pool == [19900, 19900]
    err = capsys.readouterr().err
    for n in (0, 1):
        mine = [ln for ln in err.splitlines() if ln.startswith(f"[node {n}]")]
        bars = [ln for ln in mine if "/200" in ln]
        assert 1 <= len(bars) <= 3, err  # the first state, maybe one more after 5 s, the last
        assert "200/200" in bars[-1]
        assert all(ln.strip() != f"[node {n}]" for ln in mine)  # tqdm's closing newline: no empty line


def queued(c: Console) -> int:
    """Characters of the lines the live view holds for the terminal."""
    return console_backlog(c)


def test_live_mode_keeps_the_node_prefix_of_a_line_broken_across_a_refresh() -> None:
    """A piece of a line printed above the view, the view drawn below it, then the rest of the
    line: the rest goes on on a new row, which names its node as every row does."""
    rc, buf = rich_console()
    c = Console(mode="live", rich_console=rc)
    startup(c)
    c(ev.TaskStarted(0, 0, "f"))
    c(ev.TaskOutput(0, 0, "stdout", "first half ", True))
    deadline = time.monotonic() + 30  # the flush loop prints it (later on a loaded machine)
    while "first half" not in strip(buf.getvalue()):
        assert time.monotonic() < deadline, "the piece was never printed"
        time.sleep(0.02)
    c(ev.TaskOutput(0, 0, "stdout", "second half"))
    c(ev.TaskFinished(0, 0, "f", True, 0.1))
    c(ev.PoolStopped("p1", 0.0, True))
    rows = [row.strip() for row in strip(buf.getvalue()).splitlines() if "half" in row]
    assert rows == ["[node 0] first half", "[node 0] second half"], rows


class _SlowTerminal(io.StringIO):
    """A terminal that takes 2 MB/s: slower than a task can print."""

    def write(self, text: str) -> int:
        time.sleep(len(text) / 2e6)
        return super().write(text)


def test_live_view_holds_a_bounded_backlog_and_loses_no_line(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import skyward.console.view as console_module

    monkeypatch.setattr(console_module, "MAX_PENDING_BYTES", 256 << 10)
    terminal = _SlowTerminal()
    c = Console(rich_console=RichConsole(file=terminal, force_terminal=True, width=200))
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], queued(c))
            time.sleep(0.002)

    @sky.compute
    def flood(lines: int) -> int:
        pad = "x" * 90
        for k in range(lines):
            print(f"line {k} {pad}")
        return lines

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        with sky.ComputePool(console=False, on_event=c) as pool:
            assert flood(40_000) >> pool == 40_000  # about 4 MB of output
    finally:
        done.set()
        sampler.join()
    text = strip(terminal.getvalue())
    assert all(f"line {k} " in text for k in (0, 19_999, 39_999))
    assert text.count(" xxxxxxxxxx") == 40_000  # every line reached the terminal
    assert peak[0] < (256 << 10) + (64 << 10), peak[0]  # the backlog stayed near its bound


class _StalledTerminal(io.StringIO):
    """A terminal that takes nothing while ``stalled`` is set (a frozen SSH session, Ctrl-S)."""

    def __init__(self) -> None:
        super().__init__()
        self.stalled = threading.Event()
        self.resumed = threading.Event()

    def write(self, text: str) -> int:
        if self.stalled.is_set():
            self.resumed.wait(60)
        return super().write(text)

    def stall(self) -> None:
        self.resumed.clear()
        self.stalled.set()

    def resume(self) -> None:
        self.stalled.clear()
        self.resumed.set()


def test_a_stalled_terminal_costs_lines_counted_on_screen_not_the_worker_or_its_results(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import skyward.console.view as console_module

    monkeypatch.setattr(console_module, "MAX_PENDING_BYTES", 256 << 10)
    terminal = _StalledTerminal()
    c = Console(rich_console=RichConsole(file=terminal, force_terminal=True, width=200))
    lines = 30_000  # about 3 MB: far past the bound

    @sky.compute
    def flood(n: int) -> int:
        for k in range(n):
            print(f"line {k} " + "x" * 90)
        return n

    # idle_timeout: a worker whose frames the client stops reading for 5 s counts as lost.
    with sky.ComputePool(console=False, on_event=c, idle_timeout=5, heartbeat_interval=0.5) as pool:
        terminal.stall()
        try:
            started = time.monotonic()
            assert flood(lines) >> pool == lines  # neither lost nor waiting for the terminal
            took = time.monotonic() - started
            assert terminal.stalled.is_set() and took < 20, took
            assert queued(c) < (256 << 10) + (64 << 10)  # what waits for the terminal stays bounded
        finally:
            terminal.resume()
    text = strip(terminal.getvalue())
    shown = text.count(" xxxxxxxxxx")
    markers = [int(m.replace(",", "")) for m in re.findall(r"skyward: ([\d,]+) lines? of output not shown", text)]
    assert markers and shown + sum(markers) == lines, (shown, markers)  # every line shown or counted
    summary = [ln for ln in text.splitlines() if " stopped: " in ln]
    assert summary and f"{sum(markers):,} output lines not shown" in summary[-1], text[-500:]


def test_a_line_in_pieces_is_printed_whole_and_another_nodes_line_breaks_it_off(
        capsys: pytest.CaptureFixture[str]) -> None:
    c = Console(mode="plain")
    startup(c, logs=False)
    c(ev.TaskOutput(0, 1, "stdout", "ab", True))  # a line longer than 64 KiB, or flushed early
    c(ev.TaskOutput(0, 1, "stdout", "cd"))
    c(ev.TaskOutput(0, 1, "stdout", "ef", True))
    c(ev.TaskOutput(1, 2, "stdout", "other"))  # another node's line meanwhile
    c(ev.TaskOutput(0, 1, "stdout", "gh"))
    assert capsys.readouterr().out == "[node 0] abcd\n[node 0] ef\n[node 1] other\n[node 0] gh\n"
