"""``skyward dashboard`` over a wide cluster, in a real browser: 128 Local nodes and a job that
prints 10,000 lines a second.

A Local cluster of NODES nodes runs a job whose nodes print 10,000 lines a second in all; a real
``skyward dashboard`` server (its own process) is opened in headless Chromium (Debian's, through
its chromedriver). Measured:

* each page's first contentful paint (Chromium's paint timing) and the time until its data shows
  (every node sampled on the cluster page, the first log lines on the job page), both from the
  start of the navigation (``performance.now()``);
* with the cluster page open (it asks every 3 s: every node sampled), for WINDOW seconds: the
  server's CPU, the CPU of commands run for the nodes (on Local the server's child processes:
  none since a node's first worker answers the look itself) and the cluster's workers' CPU,
  against the same window with no page open.

::

    python bench/dashboard_wide.py           # 128 nodes; writes its section of docs/benchmarks.md
    python bench/dashboard_wide.py --quick   # 8 nodes, short windows; a smoke test
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from _common import loadavg, run_section  # noqa: E402
from dashboard import cpu_seconds, sky  # noqa: E402

OWNER = "bench/dashboard_wide.py"
LINES_PER_SECOND = 10_000
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
JOB = """\
name: chatty
num_nodes: {nodes}
run: |
  python3 -u -c "
  import sys, time
  i, t = 0, time.monotonic()
  while True:
      sys.stdout.write(''.join('line %d of a job that prints ten thousand lines a second\\\\n' % (i + k) for k in range({batch})))
      sys.stdout.flush()
      i, t = i + {batch}, t + 0.1
      time.sleep(max(0.0, t - time.monotonic()))
  "
"""


def browser(work: str):  # type: ignore[no-untyped-def]
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900",
                 f"--user-data-dir={work}/chromium", "--disable-gpu"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


def page(driver, url: str, ready: str, timeout: float = 300) -> dict:  # type: ignore[no-untyped-def]
    """Open ``url``; its first contentful paint and the time ``ready`` (a JS expression) first
    holds, both in ms from the start of the navigation."""
    driver.get(url)
    deadline = time.monotonic() + timeout
    while True:
        now = driver.execute_script(f"return ({ready}) ? performance.now() : null;")
        if now is not None:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url}: {ready} never held")
        time.sleep(0.05)
    fcp = driver.execute_script(
        "const p = performance.getEntriesByName('first-contentful-paint')[0]; return p ? p.startTime : null;")
    return {"first_paint_ms": fcp, "data_ms": now}


def workers_cpu(pids: list[int]) -> float:
    return sum(cpu_seconds(pid)[0] for pid in pids)


def window(server: int, workers: list[int], seconds: float) -> dict:
    cpu0, kids0, w0, t0 = *cpu_seconds(server), workers_cpu(workers), time.monotonic()
    time.sleep(seconds)
    cpu1, kids1, w1, wall = *cpu_seconds(server), workers_cpu(workers), time.monotonic() - t0
    return {"wall": wall, "server": (cpu1 - cpu0) / wall, "samples": (kids1 - kids0) / wall,
            "workers": (w1 - w0) / wall}


def measure(quick: bool) -> dict:
    nodes, seconds = (8, 6) if quick else (int(os.environ.get("SKYWARD_BENCH_NODES", "128")), 30)
    work = tempfile.mkdtemp(prefix="skybw")
    os.environ["SKYWARD_HOME"] = work
    batch = max(1, LINES_PER_SECOND // nodes // 10)
    with open(os.path.join(work, "job.yaml"), "w") as f:
        f.write(JOB.format(nodes=nodes, batch=batch))
    result: dict = {"nodes": nodes, "seconds": seconds, "lines_per_second": batch * 10 * nodes,
                    "load_start": loadavg()}
    started = time.monotonic()
    launched = sky("launch", "-c", "bench-wide", "-d", "--num-nodes", str(nodes), "job.yaml", cwd=work)
    if launched.returncode != 0:
        raise RuntimeError(launched.stderr)
    result["launch_seconds"] = time.monotonic() - started
    from skyward.clusters import manage

    record = manage.ClusterStore().get("bench-wide")
    assert record is not None
    workers = [pid for pid, _ in record.workers]
    server = subprocess.Popen([sys.executable, "-m", "skyward.cli", "dashboard", "--port", "0", "--no-browser"],
                              cwd=work, env={**os.environ, "PYTHONPATH": ROOT}, stdout=subprocess.PIPE, text=True)
    driver = None
    try:
        assert server.stdout is not None
        url = server.stdout.readline().split()[-1]
        base = url.split("/?")[0]
        driver = browser(work)
        driver.get(url)  # (sets the cookie)
        driver.get("about:blank")
        time.sleep(5)  # (the clusters page's first poll, still answering, is not counted as idle)
        result["idle"] = window(server.pid, workers, seconds)  # no page open
        result["clusters_page"] = page(driver, base + "/", "document.querySelector('#clusters tbody tr')")
        result["cluster_page"] = page(driver, base + "/clusters/bench-wide",
                                      f"[...document.querySelectorAll('#nodes tbody tr')].filter("
                                      f"r => r.cells[3].textContent.endsWith('%')).length === {nodes}")
        result["watched"] = window(server.pid, workers, seconds)  # the cluster page open, sampling
        result["job_page"] = page(driver, base + "/clusters/bench-wide/jobs/1",
                                  "document.querySelectorAll('#log .line').length > 0")
        result["following"] = window(server.pid, workers, seconds)  # the job page open, following
    finally:
        if driver is not None:
            driver.quit()
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:  # (a poll of every node still answering)
            server.kill()
            server.wait(30)
        for _ in range(3):  # (a loaded machine may not confirm the workers gone at once)
            if sky("down", "bench-wide", "-y", cwd=work).returncode == 0:
                break
        shutil.rmtree(work, ignore_errors=True)
    result["load_end"] = loadavg()
    return result


def section(r: dict, quick: bool) -> str:
    n = r["nodes"]

    def ms(p: dict) -> str:
        return f"{p['first_paint_ms']:.0f} ms / {p['data_ms'] / 1000:.1f} s"

    def pct(x: float) -> str:
        return f"{100 * x:.1f} %"

    return "\n".join([
        f"## Dashboard: {n} nodes in the browser",
        "",
        f"*Generated by `python bench/dashboard_wide.py{' --quick' if quick else ''}` on "
        f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')}; load average {r['load_start'][0]:.2f} at the start, "
        f"{r['load_end'][0]:.2f} at the end. Re-running it rewrites this section only.*",
        "",
        f"A Local cluster of {n} nodes (launched in {r['launch_seconds']:.0f} s), every node a worker "
        f"process on this machine, runs a job whose nodes print {r['lines_per_second']:,} lines a second in "
        f"all; a `skyward dashboard` server is opened in headless Chromium. Times from the start of each "
        f"navigation; CPU over {r['seconds']} s windows, in % of one core.",
        "",
        "| figure | value |",
        "| --- | --- |",
        f"| clusters page: first paint / the cluster's row shown | {ms(r['clusters_page'])} |",
        f"| cluster page: first paint / all {n} nodes sampled and shown | {ms(r['cluster_page'])} |",
        f"| job page: first paint / first log lines shown | {ms(r['job_page'])} |",
        f"| server CPU: no page open / cluster page open / job page following | {pct(r['idle']['server'])} / "
        f"{pct(r['watched']['server'])} / {pct(r['following']['server'])} |",
        f"| commands run for the nodes by the cluster page's polls, per node | "
        f"{pct(r['watched']['samples'] / n)} (all {n}: {pct(r['watched']['samples'])}) |",
        f"| the workers' own CPU, per worker: no page open / cluster page open | "
        f"{pct(r['idle']['workers'] / n)} / {pct(r['watched']['workers'] / n)} |",
        "",
        "While the cluster page is open it polls every 3 s; each poll asks every worker whether it is",
        "up and each node's first worker for a look (its CPU since the last look, memory, GPUs, its part",
        "of the job queue), on their control sockets: on Local from the server's own process, no",
        "command started. The workers' own CPU is their heartbeat and their answers to those asks (the",
        "job's printing processes are not theirs).",
    ])


if __name__ == "__main__":
    run_section(OWNER, __doc__, "dashboard_wide", measure, section)
