"""``skyward dashboard`` over a wide cluster, in a real browser: NODES Local nodes and a job that
prints 10,000 lines a second, against 1 node and a quiet job, measured in the same run.

One dashboard server (its own process) and one headless Chromium (Debian's, through its
chromedriver) look at two clusters in turn, each launched for its turn and ended after it:

* the baseline: 1 node, whose job prints 10 lines a second (no log load);
* the wide one: NODES nodes (128 by default), whose job prints 10,000 lines a second in all.

For each: the first contentful paint of the clusters page, the cluster page and the job page
(Chromium's paint timing, from the start of the navigation) and the time their data shows (the
cluster's row; every node sampled; the first log lines); then WINDOW seconds with the cluster
page open (it samples every node every 3 s) and WINDOW seconds with the job page following the
log: the server's CPU (its own, and the commands it runs for the nodes: on Local its children, none
once the server reads a Local node's log itself),
the page's long tasks (its main thread busy over 50 ms at a time) and the log page's **lag**:
every batch a node prints ends with a line that carries the time it was printed, and the page
notes, as each such line is added to it, how long ago that was. The figures are given as
ratios wide / baseline, with the load average.

Bounded: every wait has the run's deadline (``300 + 5 s a node`` of wall time from its start;
then the cleanup, each step of it bounded too); on every way out (the deadline, an error,
SIGTERM or Ctrl-C) it ends the browser, the server and the clusters, and removes its folder.

::

    python bench/dashboard_wide.py --nodes 16   # writes its section of docs/benchmarks.md
    python bench/dashboard_wide.py              # 128 nodes: a heavy run
    python bench/dashboard_wide.py --quick      # 4 nodes, short windows; printed, not written
"""

from __future__ import annotations

import os
import signal
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from _common import (CHROMEDRIVER, CHROMIUM, Dashboard, bench_home, chatty_job, cluster, generated,  # noqa: E402
                     loadavg, percentile, run_section, window)

OWNER = "bench/dashboard_wide.py"
LINES_PER_SECOND = 10_000
QUIET = 10  # (the baseline job's lines a second)
REPEATS = 3  # (navigations to each page: their median)
READY_S = 120  # (a page's data not shown by then: said so, and the run goes on)
#: Installed in a page at the start of a window: its long tasks, and on a job page the lag of
#: each line that says when it was printed (`` sent TIME``) as it is added to the log.
OBSERVE = r"""
window.bench = {lags: [], added: 0, long: []};
new PerformanceObserver(l => { for (const e of l.getEntries()) window.bench.long.push(e.duration); })
  .observe({type: "longtask"});
const log = document.getElementById("log");
if (log) new MutationObserver(records => {
  const now = Date.now() / 1000;
  for (const r of records) for (const n of r.addedNodes) {
    window.bench.added++;
    const m = / sent (\d+\.\d+)$/.exec(n.textContent);
    if (m) window.bench.lags.push(now - parseFloat(m[1]));
  }
}).observe(log, {childList: true});
"""


class Stopped(Exception):
    pass


def _stopped(signum: int, frame: object) -> None:
    raise Stopped(f"signal {signum}: asked to stop")


def browser(work: str):  # type: ignore[no-untyped-def]
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900",
                 f"--user-data-dir={work}/chromium", "--disable-gpu"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


def end_browser(driver, work: str) -> None:  # type: ignore[no-untyped-def]
    """Quit it; then end any of its processes left (their command line names this run's profile)."""
    try:
        driver.quit()
    except Exception:
        pass
    mark = f"--user-data-dir={work}/chromium".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if mark in f.read():
                    os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass


def page(driver, url: str, ready: str, timeout: float) -> dict:  # type: ignore[no-untyped-def]
    """Open ``url`` REPEATS times; each time its first contentful paint, its navigation's
    response end and the time ``ready`` (a JS expression) first holds, in ms from the start of
    the navigation (None: not within READY_S); the median of each (the page is left open)."""
    runs = []
    for _ in range(REPEATS):
        driver.get(url)
        deadline = time.monotonic() + min(timeout, READY_S)
        while (now := driver.execute_script(f"return ({ready}) ? performance.now() : null;")) is None:
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        found = driver.execute_script(
            "const p = performance.getEntriesByName('first-contentful-paint')[0];"
            "const n = performance.getEntriesByType('navigation')[0];"
            "return [p ? p.startTime : null, n ? n.responseEnd : null];")
        runs.append({"first_paint_ms": found[0], "response_ms": found[1], "data_ms": now})
    def median(key: str) -> float | None:
        known = [r[key] for r in runs if r[key] is not None]
        return statistics.median(known) if len(known) == len(runs) else None

    return {key: median(key) for key in runs[0]} | {"runs": runs}


def watched(driver, server: Dashboard, workers: list[int], seconds: float) -> dict:  # type: ignore[no-untyped-def]
    """The open page for ``seconds``: the server's CPU, the page's long tasks and log lag."""
    driver.execute_script(OBSERVE)
    cpu = window(server.pid, workers, seconds)
    seen = driver.execute_script("return window.bench;")
    return {**cpu, "lags": seen["lags"], "added": seen["added"], "long_ms": seen["long"]}


def one(driver, server: Dashboard, work: str, name: str, nodes: int, rate: float,  # type: ignore[no-untyped-def]
        seconds: float, deadline: float) -> dict:
    """Cluster ``name`` (``nodes`` nodes, a job printing ``rate`` lines a second) looked at, by
    ``deadline`` (monotonic: TimeoutError after)."""
    def left() -> float:
        if time.monotonic() + 2 * seconds > deadline:
            raise TimeoutError(f"the run's time is up ({name})")
        return deadline - 2 * seconds - time.monotonic()

    with open(os.path.join(work, f"{name}.yaml"), "w") as f:
        f.write(chatty_job(nodes, rate))
    started = time.monotonic()
    with cluster(name, work, "-d", "--num-nodes", str(nodes), f"{name}.yaml", timeout=left()):
        r: dict = {"nodes": nodes, "lines_per_second": rate, "launch_s": time.monotonic() - started}
        from skyward.clusters import manage

        record = manage.ClusterStore().get(name)
        assert record is not None
        workers = [pid for pid, _ in record.workers]
        r["clusters_page"] = page(driver, server.base + "/", "document.querySelector('#clusters tbody tr')", left())
        r["cluster_page"] = page(driver, f"{server.base}/clusters/{name}",
                                 "[...document.querySelectorAll('#nodes tbody tr')].filter("
                                 f"r => r.cells[3].textContent.endsWith('%')).length === {nodes}", left())
        r["sampling"] = watched(driver, server, workers, seconds)
        r["job_page"] = page(driver, f"{server.base}/clusters/{name}/jobs/1",
                             "document.querySelectorAll('#log .line').length > 0", left())
        r["following"] = watched(driver, server, workers, seconds)
        r["load"] = loadavg()
    return r


def measure(quick: bool, nodes: int) -> dict:
    seconds = 5 if quick else 20
    budget = 60 + 240 + 5 * nodes
    deadline = time.monotonic() + budget
    result: dict = {"nodes": nodes, "seconds": seconds, "budget_s": budget, "load_start": loadavg()}
    before = signal.signal(signal.SIGTERM, _stopped)
    try:
        with bench_home("skybw") as work, Dashboard(work) as server:
            driver = browser(work)
            driver.set_page_load_timeout(120)
            driver.set_script_timeout(60)
            try:
                driver.get(server.url)  # (sets the cookie; the page's script and styles cached: not counted)
                for label, n, rate in (("baseline", 1, QUIET), ("wide", nodes, LINES_PER_SECOND)):
                    result[label] = one(driver, server, work, f"bench-{label}", n, rate, seconds, deadline)
            finally:
                end_browser(driver, work)
    finally:
        signal.signal(signal.SIGTERM, before)
    result["load_end"] = loadavg()
    return result


def section(r: dict, quick: bool) -> str:
    b, w, n = r["baseline"], r["wide"], r["nodes"]

    def row(what: str, get, unit: str, digits: int = 0) -> str:  # type: ignore[no-untyped-def]
        def one(c: dict) -> tuple[float | None, str]:
            try:
                x = get(c)
            except TypeError:  # (a page whose data did not show within READY_S)
                return None, f"not within {READY_S} s"
            return x, f"{x:.{digits}f} {unit}".rstrip()

        (x, tx), (y, ty) = one(b), one(w)
        return f"| {what} | {tx} | {ty} | {f'{y / x:.1f}×' if x and y is not None else '-'} |"

    def cpu(key: str):  # type: ignore[no-untyped-def]
        return lambda c: 100 * (c[key]["server"] + c[key]["node_commands"])

    def lag(q: float):  # type: ignore[no-untyped-def]
        return lambda c: percentile(c["following"]["lags"], q) if c["following"]["lags"] else float("nan")

    return "\n".join([
        f"## Dashboard: {n} nodes in the browser",
        "",
        generated(OWNER + (f" --nodes {n}" if n != 128 and not quick else ""), quick, r),
        "",
        f"One `skyward dashboard` server, opened in headless Chromium, looks at a Local cluster of 1 node "
        f"whose job prints {QUIET} lines a second (the baseline), then at one of {n} nodes (launched in "
        f"{w['launch_s']:.0f} s) whose job prints {w['lines_per_second']:,} lines a second in all; each cluster "
        "is ended before the next. Paint and data times from the start of each navigation (Chromium's paint "
        f"timing); CPU in % of one core over {r['seconds']} s windows (the server's own and the commands it "
        "runs for the nodes); lag: a line printed → added to the job page (every line that says when it was "
        "printed, one a batch, 10 batches a second per node).",
        "",
        f"| figure | 1 node, {QUIET} lines/s | {n} nodes, {w['lines_per_second']:,} lines/s | ratio |",
        "| --- | --- | --- | --- |",
        row("clusters page: first paint", lambda c: c["clusters_page"]["first_paint_ms"], "ms"),
        row("cluster page: first paint", lambda c: c["cluster_page"]["first_paint_ms"], "ms"),
        row("cluster page: every node sampled and shown", lambda c: c["cluster_page"]["data_ms"] / 1000, "s", 1),
        row("job page: first paint", lambda c: c["job_page"]["first_paint_ms"], "ms"),
        row("job page: first log lines shown", lambda c: c["job_page"]["data_ms"] / 1000, "s", 1),
        row("server CPU, cluster page open", cpu("sampling"), "%", 1),
        row("server CPU, job page following the log", cpu("following"), "%", 1),
        row("of which the commands run for the nodes", lambda c: 100 * c["following"]["node_commands"], "%", 1),
        row("log lag, median", lag(50), "s", 2),
        row("log lag, p90", lag(90), "s", 2),
        row("log lines added to the page a second", lambda c: c["following"]["added"] / c["following"]["wall"],
            "", 0),
        row("the job page's long tasks (main thread busy > 50 ms), total a second",
            lambda c: sum(c["following"]["long_ms"]) / c["following"]["wall"], "ms", 0),
        row("load average (1 min) at the end of the turn", lambda c: c["load"][0], "", 2),
        "",
        f"Each page opened {REPEATS} times, the median shown. The job page keeps its last 5,000 lines: it adds "
        "at most that many a poll and says how many it let go. The longest long task of the "
        f"{n}-node job page: {max(w['following']['long_ms'], default=0):.0f} ms; its longest lag "
        f"{max(w['following']['lags'], default=float('nan')):.2f} s. On Local the server reads each node's queue "
        "and log itself, from the byte the page has shown (it starts no command); a job page starts from each "
        "node's last 256 KiB.",
    ])


if __name__ == "__main__":
    run_section(OWNER, __doc__, "dashboard_wide", measure, section, nodes=(4, 128))
