"""``skyward dashboard`` for real: the command's server (a subprocess) over a real Local cluster
with a running job, asked with plain HTTP (the token, Host and Origin checks; no secret in any
answer) and driven by a real headless Chromium (Debian's, through its chromedriver: nothing is
downloaded, Selenium Manager never runs). Every wait is on a state, with a bound.

Set SKYWARD_DASHBOARD_SCREENSHOTS=docs/images to renew the docs page's screenshots."""

from __future__ import annotations

import http.client
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from skyward.clusters import jobs, manage
from skyward.jobs import controller
from tests.conftest import free_port, pid_alive, wait_gone
from tests.leftovers import cluster_home
from tests.test_cluster_cli import ROOT, sky, task

SECRET = "s3cr3t-dashboard-planted-5b1e"
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
#: The job: says the secret is set (never what it is), prints markup, then ticks until killed,
#: and prints a marker line once the test asks for it (the live log's check).
JOB = """\
name: ticker
run: |
  echo $$ > "$PIDS/job.pid"
  [ -n "$PLANTED" ] && echo "the secret is set"
  echo '<script>document.title="pwned"</script><b>bold?</b>'
  i=0
  while true; do
    i=$((i + 1))
    [ -e "$GO/marker" ] && [ ! -e "$GO/said" ] && echo "marker line $(cat "$GO/marker")" && touch "$GO/said"
    [ $((i % 10)) -eq 0 ] && echo "tick $i"
    sleep 0.1
  done
"""


@dataclass(frozen=True)
class Board:
    port: int
    token: str
    work: Path
    server: subprocess.Popen[str]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def wait_for(check, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return value


def started(server: subprocess.Popen[str], timeout: float = 30) -> str:
    """The URL the dashboard prints when it listens."""
    assert server.stdout is not None
    ready, _, _ = select.select([server.stdout], [], [], timeout)
    assert ready, "the dashboard printed no URL"
    line = server.stdout.readline()
    assert line.startswith("skyward dashboard: http://127.0.0.1:"), line
    return line.split()[-1]


@pytest.fixture(scope="module")
def board(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Board]:
    """Cluster ``dash`` running the ticker job (job 1, its secret planted), and a dashboard."""
    work = tmp_path_factory.mktemp("dash")
    for folder in ("pids", "go"):
        (work / folder).mkdir()
    with pytest.MonkeyPatch.context() as patch, cluster_home(patch, "skyd"):
        task(work, JOB, "job.yaml")
        launched = sky("launch", "-c", "dash", "-d", "job.yaml", "--env", f"PIDS={work / 'pids'}", "--env",
                       f"GO={work / 'go'}", "--secret", f"PLANTED={SECRET}", cwd=work)
        assert launched.returncode == 0, launched.stderr
        port = free_port()
        server = subprocess.Popen([sys.executable, "-m", "skyward.cli", "dashboard", "--port", str(port),
                                   "--no-browser"], cwd=work, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            url = started(server)
            assert url.startswith(f"http://127.0.0.1:{port}/?token=")
            yield Board(port, url.split("token=")[1], work, server)
        finally:
            server.terminate()
            server.wait(30)
            assert controller.stop() == [], "the managed jobs' controller or a launcher did not end"


def ask(board: Board, method: str, path: str, *, host: str | None = None, token: str | None = None,
        header_token: str | None = None, origin: str | None = None) -> tuple[int, str]:
    headers = {"Host": host or f"127.0.0.1:{board.port}"}
    if token is not None:
        headers["Cookie"] = f"skyward_dashboard_{board.port}={token}"
    if header_token is not None:
        headers["X-Skyward-Token"] = header_token
    if origin is not None:
        headers["Origin"] = origin
    conn = http.client.HTTPConnection("127.0.0.1", board.port, timeout=60)
    try:
        conn.request(method, path, headers=headers)
        reply = conn.getresponse()
        return reply.status, reply.read().decode()
    finally:
        conn.close()


def test_requests_without_the_token_or_from_another_host_or_origin_are_refused_and_do_nothing(board: Board) -> None:
    good, bad = board.token, board.token[:-1] + ("A" if board.token[-1] != "A" else "B")
    assert ask(board, "GET", "/")[0] == 403
    assert ask(board, "GET", f"/?token={bad}")[0] == 403
    assert ask(board, "GET", "/api/clusters", token=bad)[0] == 403
    assert ask(board, "GET", "/api/clusters", token=good, host="evil.example")[0] == 403
    assert ask(board, "GET", "/api/clusters", token=good, host=f"evil.example:{board.port}")[0] == 403
    assert ask(board, "GET", "/api/clusters", token=good, host=f"localhost:{board.port}")[0] == 200
    code, text = ask(board, "GET", f"/?token={good}")
    assert code == 303  # (to the same page without the token in its URL, the cookie set)
    refused = [
        ask(board, "POST", "/api/clusters/dash/down", token=good),  # the cookie alone: no action
        ask(board, "POST", "/api/clusters/dash/down", token=good, header_token=bad),
        ask(board, "POST", "/api/clusters/dash/down", header_token=good),  # no cookie
        ask(board, "POST", "/api/clusters/dash/down", token=good, header_token=good, origin="http://evil.example"),
        ask(board, "POST", "/api/clusters/dash/stop", token=good, header_token=good, host="evil.example"),
        ask(board, "POST", "/api/clusters/dash/jobs/1/cancel", token=good),
        ask(board, "POST", "/api/clusters/dash/jobs/1/cancel", token=good, header_token=good,
            origin=f"http://localhost:{board.port + 1}"),
    ]
    assert [code for code, _ in refused] == [403] * len(refused), refused
    assert all(text.startswith("forbidden: ") for _, text in refused)
    assert [s.status for s in manage.status(["dash"])] == ["UP"]
    assert jobs.job("dash", 1).status == "RUNNING"  # type: ignore[union-attr]
    assert pid_alive(int((board.work / "pids" / "job.pid").read_text()))


def test_no_page_or_answer_holds_the_secret_and_a_log_line_is_text(board: Board) -> None:
    wait_for(lambda: "the secret is set" in ask(board, "GET", "/api/clusters/dash/jobs/1/log",
                                                token=board.token)[1], 30, "the job's first lines")
    paths = ["/", "/jobs", "/clusters/dash", "/clusters/dash/jobs/1", "/api/clusters", "/api/clusters/dash",
             "/api/jobs", "/api/clusters/dash/jobs/1/log", "/api/clusters/dash/jobs/1/log?seen=0:1",
             "/static/dashboard.js", "/static/style.css", "/api/clusters/nothing", "/clusters/nothing"]
    answers = {path: ask(board, "GET", path, token=board.token) for path in paths}
    assert {p: c for p, (c, _) in answers.items() if c != 200} == {"/api/clusters/nothing": 503}
    assert [p for p, (_, text) in answers.items() if SECRET in text] == []
    lines = [line["text"] for line in json.loads(answers["/api/clusters/dash/jobs/1/log"][1])["lines"]]
    assert lines[:2] == ["the secret is set", '<script>document.title="pwned"</script><b>bold?</b>']
    assert json.loads(answers["/api/clusters/nothing"][1]) == {"error": "no cluster named nothing", "gone": True,
                                                               "events": []}


def node_files() -> tuple[Path, Path]:
    """Node 0's log of job 1, and the file naming the node's queue tool (Local: on this machine)."""
    record = manage.ClusterStore().get("dash")
    assert record is not None
    base = Path(record.roots[0]) / "c" / record.id
    return base / "jobs" / "0" / "1.log", base / "jobqueue.path"


def log_poll(board: Board, seen: dict[str, int] | None = None) -> dict:
    text = ",".join(f"{n}:{c}" for n, c in (seen or {}).items())
    code, answer = ask(board, "GET", f"/api/clusters/dash/jobs/1/log?seen={text}", token=board.token)
    assert code == 200, answer
    return json.loads(answer)


def test_a_log_poll_reads_only_the_bytes_after_the_offset_the_page_carries(board: Board) -> None:
    def ticked() -> dict | None:
        answer = log_poll(board)
        return answer if any(x["text"].startswith("tick") for x in answer["lines"]) else None

    first = wait_for(ticked, 30, "a tick")
    log, _ = node_files()
    offset = first["seen"]["0"]
    shown = sum(len(x["text"].encode()) + 1 for x in first["lines"])
    assert offset == shown <= log.stat().st_size  # (a byte offset: the lines sent, newlines with them)
    with open(log, "r+b") as f:  # what was read is replaced (same size, other lines): never read again
        before = f.read(offset)
        f.seek(0)
        f.write(b"x\n" * (offset // 2) + b"\n" * (offset % 2))
    try:
        later = wait_for(lambda: (a := log_poll(board, first["seen"]))["lines"] and a, 10, "a new tick")
    finally:
        with open(log, "r+b") as f:
            f.write(before)
    assert [x["text"] for x in later["lines"] if not x["text"].startswith("tick ")] == []
    assert later["seen"]["0"] == offset + sum(len(x["text"].encode()) + 1 for x in later["lines"])


def test_a_node_whose_tool_predates_offsets_still_shows_the_log(board: Board, tmp_path: Path) -> None:
    """A cluster started by an older skyward keeps its node-side tool, which knows no ``read``: the
    server asks it the old way and sends on only what is new all the same."""
    import skyward

    here = Path(skyward.__file__).parent
    (tmp_path / "runtime").mkdir()
    for name in ("_procs.py", "runtime/jobqueue.py", "runtime/spawned.py"):
        (tmp_path / name).symlink_to(here / name)
    tool = (here / "runtime" / "jobtool.py").read_text()
    assert tool.count('if what == "read":') == 1
    (tmp_path / "runtime" / "jobtool.py").write_text(tool.replace('if what == "read":', "if False:"))
    _, pointer = node_files()
    kept = pointer.read_text()
    pointer.write_text(str(tmp_path / "runtime" / "jobtool.py"))
    try:
        first = log_poll(board)
        assert first["lines"][:2] == [{"node": 0, "text": "the secret is set"},
                                      {"node": 0, "text": '<script>document.title="pwned"</script><b>bold?</b>'}]
        assert first["seen"]["0"] == sum(len(x["text"].encode()) + 1 for x in first["lines"])
        later = wait_for(lambda: (a := log_poll(board, first["seen"]))["lines"] and a, 10, "a new tick")
        assert [x["text"] for x in later["lines"] if not x["text"].startswith("tick ")] == []
    finally:
        pointer.write_text(kept)


def test_a_job_page_starts_from_each_nodes_last_bytes_and_says_so(board: Board) -> None:
    """A log longer than the page's first read: it starts at the first whole line of its last
    LOG_TAIL bytes, and the answer says so (the page shows it)."""
    from skyward.dashboard.views import LOG_TAIL

    log, _ = node_files()
    filler = b"".join(b"filler %06d\n" % i for i in range(2 * LOG_TAIL // 14))
    with open(log, "ab") as f:  # (as the job's output is: appended, in one write)
        f.write(filler)
    try:
        size = log.stat().st_size
        first = log_poll(board)
        start = first["skipped"]["0"]  # (the job may print a tick meanwhile)
        assert size - LOG_TAIL <= start < log.stat().st_size - LOG_TAIL + 14
        assert first["lines"][0]["text"].startswith("filler ") and len(first["lines"][0]["text"]) == 13
        assert first["seen"]["0"] == start + sum(len(x["text"].encode()) + 1 for x in first["lines"] if x["node"] == 0)
        assert first["note"] == (f"showing the last {LOG_TAIL // 1024} KiB of the log of node 0; "
                                 "`skyward logs dash 1` prints it all")
        assert log_poll(board, first["seen"])["skipped"] == {}  # (once it has an offset: from there)
    finally:  # (the filler taken out again: the other tests read the log from its start)
        with open(log, "r+b") as f:
            kept = f.read().replace(filler, b"", 1)
            f.seek(0)
            f.write(kept)
            f.truncate()


def children_cpu(pid: int) -> int:
    """The CPU ticks of every child process ``pid`` started and has reaped (its /proc stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[13]) + int(fields[14])  # (cutime, cstime)


def test_a_page_following_a_log_on_this_machine_starts_no_process(board: Board) -> None:
    """On a Local node the server reads the job's queue and log itself: a poll starts no command
    (before, two a node a poll: most of the server's CPU while a page follows a log)."""
    seen = log_poll(board)["seen"]
    before = children_cpu(board.server.pid)
    for _ in range(5):
        answer = log_poll(board, seen)
        assert answer["job"]["status"] == "RUNNING"
        seen = answer["seen"]
    assert children_cpu(board.server.pid) == before


def browser(work: Path):  # type: ignore[no-untyped-def]
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,760",
                 f"--user-data-dir={work / 'chromium'}", "--disable-gpu"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


#: A script whose pool opts in: 3 tasks done, 1 failed, then 2 held until the test says go.
POOL_SCRIPT = """\
import pathlib, sys, threading, time
import skyward as sky

@sky.compute
def work(i):
    if i < 0:
        raise ValueError("a planned failure")
    return i

@sky.compute
def held(path):
    import pathlib, time
    while not pathlib.Path(path).exists():
        time.sleep(0.05)
    return 1

with sky.ComputePool(sky.Local(), concurrency=4, console=False, dashboard=True) as pool:
    for i in (1, 2, 3):
        work(i) >> pool
    try:
        work(-1) >> pool
    except Exception:
        pass
    later = threading.Thread(target=lambda: sky.gather(held(sys.argv[1]), held(sys.argv[1])) >> pool)
    later.start()
    later.join()
"""


def pools(board: Board) -> list[dict]:
    code, text = ask(board, "GET", "/api/pools", token=board.token)
    assert code == 200, text
    return json.loads(text)


def test_a_node_is_looked_at_by_its_worker_and_only_when_a_cluster_page_asks(board: Board, tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The cluster's own workers read their nodes (GPUs with the nvidia-smi on *their* PATH: a
    stand-in here that counts its runs and prints the documented CSV), and only when a cluster's
    page asks: the clusters list and ``skyward status`` ask nothing of the kind; each ask of the
    cluster page looks once at each node, its job queue with it."""
    import skyward as sky

    calls = tmp_path / "calls"
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(f'#!/bin/sh\necho run >> "{calls}"\necho "87, 30512, 81559"\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}:{os.environ['PATH']}")  # (the workers' PATH, not the server's)
    with sky.ComputePool(sky.Local(), nodes=2, name="look", console=False):
        pass
    try:
        for _ in range(2):
            assert ask(board, "GET", "/api/clusters", token=board.token)[0] == 200
        assert [s.status for s in manage.status(["look"])] == ["UP"]
        assert not calls.exists(), "a node was sampled with no cluster page asking"
        code, body = ask(board, "GET", "/api/clusters/look", token=board.token)
        assert code == 200, body
        nodes = json.loads(body)["nodes"]
        assert [n["gpus"] for n in nodes] == [[{"util": 87.0, "memory_used": 30512.0, "memory_total": 81559.0}]] * 2
        assert all(0.0 <= n["cpu"] <= 100.0 and 0 < n["memory_used"] < n["memory_total"] for n in nodes), nodes
        assert calls.read_text().splitlines() == ["run", "run"]
        code, body = ask(board, "GET", "/api/clusters/dash", token=board.token)  # (its ticker job runs)
        assert code == 200, body
        assert [{k: v for k, v in j.items() if k != "cost"} for j in json.loads(body)["jobs"]] == [
            j.as_dict() for j in reversed(jobs.jobs("dash"))] != []
    finally:
        manage.down("look")


def test_a_pool_that_opts_in_is_shown_live_and_gone_once_it_ends(board: Board) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    (board.work / "pool_script.py").write_text(POOL_SCRIPT)
    go = board.work / "go" / "release"
    proc = subprocess.Popen([sys.executable, "pool_script.py", str(go)], cwd=board.work,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    driver = None
    try:
        def holding() -> dict | None:
            found = [p for p in pools(board) if p["pid"] == proc.pid]
            return found[0] if found and found[0]["running"] == 2 else None

        shown = wait_for(holding, 60, "the pool with its two held tasks")
        assert (shown["done"], shown["failed"], [n["node"] for n in shown["nodes"]]) == (3, 1, [0])
        assert shown["tasks_per_second"] > 0 and shown["script"] == "pool_script.py"
        driver = browser(board.work)
        driver.get(f"{board.url}/?token={board.token}")
        row = WebDriverWait(driver, 30).until(lambda d: d.find_elements(
            By.XPATH, f"//table[@id='pools']//tr[td[text()='{proc.pid}']]"))[0]
        assert "pool_script.py" in row.text and "2 running" in row.text
        go.touch()
        assert proc.wait(60) == 0, proc.stdout.read()  # type: ignore[union-attr]
        assert [p for p in pools(board) if p["pid"] == proc.pid] == []
        assert list((Path(os.environ["SKYWARD_HOME"]) / "pools").glob("*.json")) == []
        WebDriverWait(driver, 30).until(lambda d: not d.find_elements(
            By.XPATH, f"//table[@id='pools']//tr[td[text()='{proc.pid}']]"))
    finally:
        if driver is not None:
            driver.quit()
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def test_in_a_browser_the_cluster_is_up_the_log_follows_cancel_ends_the_job_stop_start_and_down_work(board: Board) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as seen
    from selenium.webdriver.support.ui import WebDriverWait

    shots = Path(os.environ.get("SKYWARD_DASHBOARD_SCREENSHOTS") or board.work)
    driver = browser(board.work)
    try:
        wait = WebDriverWait(driver, 30)
        driver.get(f"{board.url}/?token={board.token}")
        row = wait.until(lambda d: d.find_elements(By.XPATH, "//table[@id='clusters']//tr[td/a[text()='dash']]"))[0]
        assert row.find_element(By.CSS_SELECTOR, ".badge").text == "UP"
        assert "token" not in driver.current_url  # (sent back without it, the cookie set)
        driver.save_screenshot(str(shots / "dashboard-clusters.png"))

        driver.get(f"{board.url}/clusters/dash")  # its node sampled, its queue
        wait.until(lambda d: d.find_elements(By.XPATH, "//table[@id='nodes']//td[contains(text(), ' %')]"))
        job = wait.until(lambda d: d.find_elements(By.XPATH, "//table[@id='jobs']//tr[td/a[text()='1']]"))[0]
        assert job.find_element(By.CSS_SELECTOR, ".badge").text == "RUNNING"
        assert "GiB of" in driver.find_element(By.ID, "nodes").text

        driver.get(f"{board.url}/clusters/dash/jobs/1")
        log = wait.until(lambda d: d.find_element(By.ID, "log") if "tick" in d.find_element(By.ID, "log").text
                         else None)
        assert '<script>document.title="pwned"</script><b>bold?</b>' in log.text  # shown as text
        assert log.find_elements(By.CSS_SELECTOR, "script, b") == [] and driver.title != "pwned"
        (board.work / "go" / "marker").write_text(str(time.time()))
        wait.until(lambda d: "marker line" in d.find_element(By.ID, "log").text)
        driver.save_screenshot(str(shots / "dashboard-job.png"))

        pid = int((board.work / "pids" / "job.pid").read_text())
        wait.until(seen.element_to_be_clickable((By.ID, "cancel"))).click()
        wait.until(seen.alert_is_present()).accept()
        wait.until(lambda d: "CANCELLED" in d.find_element(By.ID, "summary").text)
        assert wait_gone([pid], 10) == [], "the job's process outlived its cancel"
        assert jobs.job("dash", 1).status == "CANCELLED"  # type: ignore[union-attr]

        assert sky("launch", "-c", "gone", cwd=board.work).returncode == 0  # ended from the CLI while watched
        driver.get(f"{board.url}/clusters/gone")
        wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#summary .badge").text == "UP")
        assert sky("down", "gone", "-y", cwd=board.work).returncode == 0
        wait.until(lambda d: d.find_element(By.ID, "message").text == "no cluster named gone")
        assert driver.find_element(By.CSS_SELECTOR, "#summary .badge").text == "GONE"

        driver.get(f"{board.url}/")
        for button, after in (("stop", "STOPPED"), ("start", "UP")):
            wait.until(lambda d: d.find_elements(By.XPATH, f"//tr[td/a[text()='dash']]//button[text()='{button}']")
                       )[0].click()
            wait.until(seen.alert_is_present()).accept()
            WebDriverWait(driver, 60).until(lambda d: d.find_elements(
                By.XPATH, f"//tr[td/a[text()='dash']]//span[contains(@class, 'badge')][text()='{after}']"))
            assert [s.status for s in manage.status(["dash"])] == [after]

        workers = [p for p, _ in manage.ClusterStore().get("dash").workers]  # type: ignore[union-attr]
        wait.until(lambda d: d.find_elements(By.XPATH, "//tr[td/a[text()='dash']]//button[text()='down']"))[0].click()
        wait.until(seen.alert_is_present()).accept()
        WebDriverWait(driver, 60).until(lambda d: d.find_element(By.CSS_SELECTOR, '.empty[data-for="clusters"]')
                                        .is_displayed())
        assert manage.status() == [] and wait_gone(workers, 10) == []
    finally:
        driver.quit()


def test_the_environment_variable_shows_every_pool_of_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    import skyward as sky
    from skyward.console import snapshot

    @sky.compute
    def one() -> int:
        return 1

    with cluster_home(monkeypatch, "skyp"):
        monkeypatch.setenv("SKYWARD_DASHBOARD", "1")
        with sky.ComputePool(sky.Local(), console=False) as pool:
            assert one() >> pool == 1
            mine = wait_for(lambda: [p for p in snapshot.live() if p["pid"] == os.getpid() and p["done"] == 1],
                            30, "this pool's snapshot")
            assert mine[0]["pool"] == pool.id and mine[0]["failed"] == 0
        assert snapshot.live() == [] and list(snapshot.folder().glob("*")) == []


def test_a_cluster_page_shows_its_timeline_its_cost_and_no_gpu(board: Board) -> None:
    """Launch, nodes added, an attach and its detach, a node lost and the down, each on the
    cluster's timeline as it happens, newest first; Local costs $0; a node without nvidia-smi
    shows "no GPU"."""
    import shutil
    import signal

    import skyward as sky
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with sky.ComputePool(sky.Local(), nodes=2, name="ev", console=False):
        pass
    with sky.ComputePool(name="ev", console=False):  # attached, then detached
        pass
    driver = browser(board.work)
    try:
        wait = WebDriverWait(driver, 30)
        driver.get(f"{board.url}/?token={board.token}")
        driver.get(f"{board.url}/clusters/ev")

        def events() -> list[tuple[str, str]]:  # (kind, text), newest first, read at once (no stale element)
            return [tuple(e) for e in driver.execute_script(
                "return [...document.querySelectorAll('#events li')].map(li => "
                "[li.children[1].textContent, li.children[2].textContent]);")]

        wait.until(lambda d: len(events()) >= 5)  # launch, 2 nodes, attach, detach (and the launch's detach)
        kinds = [k for k, _ in reversed(events())]
        assert kinds[:3] == ["launch", "node", "node"] and kinds[-2:] == ["attach", "detach"], events()
        assert [t for _, t in events()][1].startswith("a client attached (pid ")
        assert "$0.00/h, $0.00 so far" in driver.find_element(By.ID, "summary").text
        gpu = wait.until(lambda d: d.execute_script(
            "const row = [...document.querySelectorAll('#nodes tbody tr')].find(r => r.cells[0].textContent === '0');"
            "return row && row.cells[3].textContent ? row.cells[6].textContent : null;"))
        assert gpu == ("no GPU" if shutil.which("nvidia-smi") is None else gpu) and gpu

        record = manage.ClusterStore().get("ev")
        assert record is not None
        os.kill(record.workers[1][0], signal.SIGKILL)
        wait.until(lambda d: events()[0] == ("node", "node 1 lost: its worker does not answer"))
        assert manage.down("ev") == []
        wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#summary .badge").text == "GONE")
        wait.until(lambda d: events()[0] == ("down", "ended by `skyward down`"))
    finally:
        driver.quit()
        if manage.ClusterStore().get("ev") is not None:
            manage.down("ev")


def test_spot_notices_a_node_hears_are_on_its_clusters_timeline_once_at_the_time_it_heard_them(
        board: Board, monkeypatch: pytest.MonkeyPatch) -> None:
    """A spot node's worker hears the notices (a stand-in metadata service, as on EC2) while no
    client is attached and no page looks: the interruption notice, which the next client to
    attach writes on the timeline; then the rebalance recommendation, which the cluster page's
    next look writes. Each event bears the time the worker heard the notice (known here by
    asking the worker itself, which writes nothing), not the time it was written; each shows
    once on the page, with the node and its time, however often looked at."""
    from selenium.webdriver.support.ui import WebDriverWait

    import skyward as sky
    from skyward import events as ev
    from skyward.clusters import control
    from skyward.clusters.state import Event
    from skyward.worker.preemption import ENDPOINT_VAR
    from tests.hosts import imds
    from tests.spot_local import SpotLocal

    def preempts_written() -> list[Event]:
        return [e for e in manage.ClusterStore().events("spot") if e.kind == "preempt"]

    def hearing(kind: str) -> tuple[float, float]:
        """(a time before the notice was published, a time after its worker had heard it)."""
        before = time.time()
        published = metadata.interrupt("terminate") if kind == "interruption" else metadata.rebalance()
        record = manage.ClusterStore().get("spot")
        assert record is not None
        wait_for(lambda: kind in [n["kind"] for n in json.loads(control.ask("look 0", record.socket(0)))["notices"]],
                 30, f"the worker to hear the {kind} notice")
        times[kind] = published
        return before, time.time()

    times: dict[str, object] = {}
    heard: list[ev.Event] = []
    with imds.on_loopback() as metadata:
        monkeypatch.setenv(ENDPOINT_VAR, metadata.endpoint)  # (the workers' environment)
        with sky.ComputePool(SpotLocal(), nodes=1, name="spot", console=False):
            pass  # (launched, and left up with no client)
        try:
            interrupted = hearing("interruption")
            interruption = ("node 0: spot interruption notice: the machine will terminate at "
                            f"{times['interruption']:%Y-%m-%d %H:%M:%S} UTC")
            assert preempts_written() == []  # (nobody attached or looked yet)
            with sky.ComputePool(SpotLocal(), nodes=1, name="spot", console=False, on_event=heard.append):
                wait_for(lambda: any(isinstance(e, ev.NodePreempting) for e in heard), 30, "the client told")
                wait_for(lambda: [e.text for e in preempts_written()] == [interruption], 10, "it on the timeline")
            assert interrupted[0] <= preempts_written()[0].at <= interrupted[1]
            rebalanced = hearing("rebalance")
            rebalance = (f"node 0: spot rebalance recommendation at {times['rebalance']:%Y-%m-%d %H:%M:%S} UTC: the "
                         "machine is at elevated risk of interruption")
            assert [e.text for e in preempts_written()] == [interruption]
            driver = browser(board.work)
            try:
                driver.get(f"{board.url}/?token={board.token}")
                driver.get(f"{board.url}/clusters/spot")

                def preempts() -> list[str]:  # newest first
                    return driver.execute_script(
                        "return [...document.querySelectorAll('#events li')].filter(li => "
                        "li.children[1].textContent === 'preempt').map(li => li.children[2].textContent);")

                WebDriverWait(driver, 30).until(lambda d: len(preempts()) == 2)
                assert preempts() == [rebalance, interruption]
                for _ in range(2):  # (more looks at the node, which still has both: neither written again)
                    assert ask(board, "GET", "/api/clusters/spot", token=board.token)[0] == 200
                assert [e.text for e in preempts_written()] == [interruption, rebalance]
                assert rebalanced[0] <= preempts_written()[1].at <= rebalanced[1]
            finally:
                driver.quit()
        finally:
            assert manage.down("spot") == []


def test_cost_so_far_and_this_month_come_from_the_price_the_record_keeps(board: Board) -> None:
    """A real cluster given a known price in its record: its cost so far, a job's cost, and this
    month's total, which keeps it once the cluster is ended."""
    import skyward as sky

    def month() -> dict:
        code, text = ask(board, "GET", "/api/costs", token=board.token)
        assert code == 200, text
        return json.loads(text)

    before = month()["total"]
    with sky.ComputePool(sky.Local(), name="priced", console=False):
        pass
    store = manage.ClusterStore()
    record = store.get("priced")
    assert record is not None and record.price_per_hour == 0.0  # (Local: free)
    now = time.time()
    start = time.mktime(time.localtime(now)[:2] + (1, 0, 0, 0, 0, 0, -1))  # this month's first second
    launched = max(now - 3600, start)
    store.put(record.with_(price_per_hour=3.6, launched_at=launched))
    code, text = ask(board, "GET", "/api/clusters", token=board.token)
    row = [c for c in json.loads(text) if c["name"] == "priced"][0]
    assert row["price_per_hour"] == 3.6 and abs(row["cost_so_far"] - (time.time() - launched) / 1000) < 0.01
    shown = month()
    assert "priced" in shown["clusters"] and abs(shown["total"] - before - (time.time() - launched) / 1000) < 0.01
    assert manage.down("priced") == []
    ended = month()
    assert ended["ended"] >= 1 and abs(ended["total"] - shown["total"]) < 0.01


MANAGED = """name: streamed
run: |
  seq 1 6000
  echo "managed says hello"
  while [ ! -e "$GO/managed" ]; do sleep 0.1; done
  echo "managed marker $(cat "$GO/managed")"
  while true; do sleep 0.1; done
"""


def test_a_managed_job_is_listed_its_log_streams_and_cancel_ends_it(board: Board) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as seen
    from selenium.webdriver.support.ui import WebDriverWait

    task(board.work, MANAGED, "managed.yaml")
    submitted = sky("jobs", "launch", "managed.yaml", "-d", "-y", "--env", f"GO={board.work / 'go'}", cwd=board.work)
    assert submitted.returncode == 0, submitted.stderr
    job = int(submitted.stdout.split("Managed job ID: ")[1].split()[0])
    driver = browser(board.work)
    try:
        wait = WebDriverWait(driver, 60)
        driver.get(f"{board.url}/jobs?token={board.token}")
        row = wait.until(lambda d: d.find_elements(By.XPATH, f"//table[@id='managed']//tr[td/a[text()='{job}']]"))[0]
        assert "streamed" in row.text and row.find_element(By.CSS_SELECTOR, ".badge").text
        driver.get(f"{board.url}/managed/{job}")
        wait.until(lambda d: "[node 0] managed says hello" in d.find_element(By.ID, "log").text)
        (board.work / "go" / "managed").write_text("42")
        wait.until(lambda d: "[node 0] managed marker 42" in d.find_element(By.ID, "log").text)
        kept = driver.execute_script("return [document.querySelectorAll('#log .line').length, "
                                     "document.querySelector('#log .line').textContent, "
                                     "document.querySelector('#log .dropped').textContent];")
        assert kept[:2] == [5000, "[node 0] 1003"]  # (the page keeps the last 5,000 of 6,002 lines)
        assert kept[2].startswith("1002 earlier lines not shown here")
        assert "RUNNING" in driver.find_element(By.ID, "summary").text
        wait.until(seen.element_to_be_clickable((By.ID, "cancel"))).click()
        wait.until(seen.alert_is_present()).accept()
        wait.until(lambda d: "CANCELLED" in d.find_element(By.ID, "summary").text)
        assert [j["status"] for j in json.loads(sky("jobs", "queue", "--json", cwd=board.work).stdout)
                if j["id"] == job] == ["CANCELLED"]
        assert manage.ClusterStore().get(f"sky-managed-{job}") is None
    finally:
        driver.quit()


def test_a_node_sample_reads_proc_and_nvidia_smi_only_where_it_exists(tmp_path: Path) -> None:
    """The sample a cluster page runs on each node, run here with ``sh``: figures from /proc, no
    GPU where there is no nvidia-smi (this machine, for real); with a stand-in nvidia-smi on the
    PATH that prints the documented ``--query-gpu`` CSV for exactly the arguments the sample
    gives (no real GPU here), each GPU's figures; with one that fails, an empty list."""
    import shutil

    from skyward.dashboard import views

    def sample(path: str) -> dict:
        done = subprocess.run(["sh", "-c", views.SAMPLE], capture_output=True, text=True, timeout=30,
                              env={**os.environ, "PATH": path})
        assert done.returncode == 0, done.stderr
        return views.parse_sample(done.stdout)

    here = sample(os.environ["PATH"])
    assert 0.0 <= here["cpu"] <= 100.0 and 0 < here["memory_used"] < here["memory_total"]
    if shutil.which("nvidia-smi") is None:
        assert here["gpus"] is None
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text('#!/bin/sh\n[ "$*" = "--query-gpu=utilization.gpu,memory.used,memory.total '
                   '--format=csv,noheader,nounits" ] || exit 9\necho "87, 30512, 81559"\necho "0, 3, 81559"\n')
    smi.chmod(0o755)
    path = f"{smi.parent}:{os.environ['PATH']}"
    assert sample(path)["gpus"] == [{"util": 87.0, "memory_used": 30512.0, "memory_total": 81559.0},
                                    {"util": 0.0, "memory_used": 3.0, "memory_total": 81559.0}]
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the driver'\n"
                   "exit 9\n")
    assert sample(path)["gpus"] == []

