"""Jobs that outlive the client, on the Local provider (issue 31): how soon a job runs, how soon a
managed job runs again after a lost node, and one controller with N tiny managed jobs. Not in CI.

Latencies, in a skyward home of its own, each repeated (median and max reported); "running"
is when the job's own code has started (it writes the time to a file as its first act):

* **cluster job, `pool.spawn`**: a named 1-node cluster already up; from ``pool.spawn(call)``
  to the call running;
* **cluster job, `skyward exec NAME -d`**: the same cluster, from starting the command
  (a fresh Python process) to the command running;
* **managed job, `sky.jobs.launch`**: the controller already running; from the call to the
  call running on the job's own new cluster (and the record's submit → RUNNING);
* **lost node → running again**: a broadcast managed job on 2 nodes; from SIGKILL of node 1's
  worker to the call running again on both nodes of the new cluster, and to the job's status
  RUNNING again (polled every 0.05 s).

Scale: for N = 50 and 200, in a skyward home of its own: every job is submitted in a row (the client
returns as the record is written), then the script waits until all have ended. Measured:

* **submit → RUNNING**: from a job's record (``started - submitted``), p50 and p90 over the jobs;
  it includes the wait behind the launches already under way (at most
  ``skyward.jobs.watch.MAX_LAUNCHES`` at once);
* **all ended**: from the first submit until the last job has ended, its cluster torn down;
* **controller memory**: its resident set (VmRSS) sampled every 0.1 s, idle before the jobs and
  at its peak; per job = (peak - idle) / N;
* **controller threads**: at most how many it had (no thread per job).

::

    python bench/managed_jobs.py           # 50 and 200 jobs; writes its section of docs/benchmarks.md
    python bench/managed_jobs.py --quick   # 20 jobs, 2 repetitions; a smoke test, figures are noise
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from _common import loadavg, run_section  # noqa: E402

OWNER = "bench/managed_jobs.py"


def _status(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def one_run(n: int) -> dict[str, Any]:
    """N jobs in a fresh skyward home; the figures of that run."""
    with tempfile.TemporaryDirectory(prefix="skym-bench-") as home:
        os.environ["SKYWARD_HOME"] = home
        from skyward.jobs import client, controller
        from skyward.launch import plan

        task = os.path.join(home, "tiny.yaml")
        with open(task, "w") as f:
            f.write("name: tiny\nrun: echo done\n")
        p = plan(task)
        pid = controller.ensure()
        time.sleep(1.0)  # (its imports settled)
        idle_kib = _status(pid, "VmRSS")
        peak = {"rss": idle_kib, "threads": _status(pid, "Threads")}
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.1):
                try:
                    peak["rss"] = max(peak["rss"], _status(pid, "VmRSS"))
                    peak["threads"] = max(peak["threads"], _status(pid, "Threads"))
                except OSError:
                    return

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        started = time.monotonic()
        ids = [client.submit(p) for _ in range(n)]
        submit_s = time.monotonic() - started
        ended = [client.wait(job, 1800) for job in ids]
        total_s = time.monotonic() - started
        done.set()
        sampler.join()
        controller.stop()
        to_running = sorted(j.started - j.submitted for j in ended if j.started)
        return {"jobs": n, "succeeded": sum(j.status == "SUCCEEDED" for j in ended), "submit_s": submit_s,
                "all_ended_s": total_s, "to_running_p50": statistics.median(to_running),
                "to_running_p90": to_running[int(0.9 * (len(to_running) - 1))], "to_running_min": to_running[0],
                "idle_mib": idle_kib / 1024, "peak_mib": peak["rss"] / 1024,
                "per_job_kib": (peak["rss"] - idle_kib) / n, "threads": peak["threads"]}


def until(check: Any, timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise TimeoutError("the benchmark's job did not get there")
        time.sleep(0.01)
    return value


def stamp(path: str) -> float:
    """The time a job wrote in ``path``, once it has."""
    def read() -> float:
        try:
            with open(path) as f:
                text = f.read().strip()
            return float(text) if text else 0.0
        except FileNotFoundError:
            return 0.0
    return float(until(read))


def latencies(reps: int) -> dict[str, list[float]]:
    """The latencies of the docstring, ``reps`` times each, in a fresh skyward home."""
    with tempfile.TemporaryDirectory(prefix="skym-bench-") as home:
        os.environ["SKYWARD_HOME"] = home
        import skyward as sky
        from skyward.clusters import manage
        from skyward.clusters.state import ClusterStore
        from skyward.jobs import client, controller

        @sky.compute
        def started(path: str, hold: str = "") -> None:
            with open(path + ".part", "w") as f:
                f.write(repr(time.time()))
            os.replace(path + ".part", path)
            while hold and not os.path.exists(hold):
                time.sleep(0.02)

        out: dict[str, list[float]] = {k: [] for k in ("spawn", "exec", "managed", "managed_record",
                                                      "recovered_running", "recovered_status")}
        env = {**os.environ, "PYTHONPATH": ROOT}
        with sky.ComputePool(name="bench-jobs", nodes=1, provider=sky.Local(), console=False) as pool:
            for i in range(reps):
                mark = os.path.join(home, f"spawn{i}")
                t0 = time.time()
                job = pool.spawn(started(mark))
                out["spawn"].append(stamp(mark) - t0)
                job.result(60)
        for i in range(reps):  # (the cluster detached: `exec` reaches it as any later process would)
            mark = os.path.join(home, f"exec{i}")
            t0 = time.time()
            done = subprocess.run([sys.executable, "-m", "skyward.cli", "exec", "bench-jobs", "-d",
                                   f"python3 -c 'import time; print(repr(time.time()))' > {mark}"], env=env,
                                  capture_output=True, text=True, timeout=120)
            if done.returncode:
                raise RuntimeError(f"skyward exec failed: {done.stderr}")
            out["exec"].append(stamp(mark) - t0)
        manage.down("bench-jobs")
        controller.ensure()
        for i in range(reps):
            mark = os.path.join(home, f"managed{i}")
            t0 = time.time()
            job = sky.jobs.launch(started(mark))
            out["managed"].append(stamp(mark) - t0)
            ended = client.wait(job.id, 120)
            out["managed_record"].append((ended.started or 0.0) - ended.submitted)
        @sky.compute
        def on_every_node(folder: str, go: str) -> None:
            mark = os.path.join(folder, f"{sky.instance_info().node}.{os.getpid()}")
            with open(mark + ".part", "w") as f:
                f.write(repr(time.time()))
            os.replace(mark + ".part", mark)
            while not os.path.exists(go):
                time.sleep(0.02)

        def runs(folder: str) -> list[str]:
            return [os.path.join(folder, n) for n in os.listdir(folder) if not n.endswith(".part")]

        for i in range(reps):
            folder, go = os.path.join(home, f"lost{i}"), os.path.join(home, f"go{i}")
            os.mkdir(folder)
            job = sky.jobs.launch(on_every_node(folder, go), nodes=2, broadcast=True, provider=sky.Local())
            until(lambda: len(runs(folder)) == 2 and job.status == "RUNNING")
            t0 = time.time()
            os.kill(ClusterStore().get(job.cluster).workers[1][0], signal.SIGKILL)
            until(lambda: client.get(job.id).recoveries == 1 and job.status == "RUNNING")
            out["recovered_status"].append(time.time() - t0)
            again = until(lambda: [m for m in runs(folder) if stamp(m) > t0] if len(runs(folder)) == 4 else None)
            out["recovered_running"].append(max(stamp(m) for m in again) - t0)
            open(go, "w").close()
            client.wait(job.id, 120)
        controller.stop()
        return out


def measure(quick: bool) -> dict[str, Any]:
    start = loadavg()
    timings = latencies(2 if quick else 5)
    runs = [one_run(n) for n in ((20,) if quick else (50, 200))]
    return {"runs": runs, "latencies": timings, "load_start": start, "load_end": loadavg(),
            "when": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def section(r: dict[str, Any], quick: bool) -> str:
    rows = "\n".join(
        f"| {x['jobs']} | {x['succeeded']} | {x['submit_s']:.1f} | {x['to_running_min']:.2f} / "
        f"{x['to_running_p50']:.1f} / {x['to_running_p90']:.1f} | {x['all_ended_s']:.1f} | {x['idle_mib']:.0f} → "
        f"{x['peak_mib']:.0f} | {x['per_job_kib']:.0f} | {x['threads']} |" for x in r["runs"])
    lat = r["latencies"]
    named = [("cluster job: `pool.spawn(call)` → the call running (cluster up)", "spawn"),
             ("cluster job: `skyward exec NAME -d CMD` started → the command running (cluster up)", "exec"),
             ("managed job: `sky.jobs.launch(call)` → the call running on its new cluster", "managed"),
             ("managed job: submitted → RUNNING in its record", "managed_record"),
             ("managed job, 2 nodes: node 1's worker SIGKILLed → the call running again on both nodes",
              "recovered_running"),
             ("managed job, 2 nodes: node 1's worker SIGKILLed → status RUNNING again", "recovered_status")]
    times = "\n".join(f"| {label} | {statistics.median(lat[key]):.2f} | {max(lat[key]):.2f} |" for label, key in named)
    return f"""## Jobs that outlive the client: latency, and one controller with many jobs

*Generated by `python {OWNER}` on {r['when']}; load average {r['load_start'][0]} at the start, \
{r['load_end'][0]} at the end; {len(lat['spawn'])} repetitions of each latency, one run per size. \
Re-running it rewrites this section only.*

On the Local provider; "running" is when the job's own code has started (it writes the time as its first act). \
The managed jobs' controller is already running (the first `sky.jobs.launch` of a machine starts it: about a \
Python start more). A managed job brings up a cluster of its own, so it runs a cluster start later than a \
job on a cluster that is up. Its record says RUNNING a little after its call has started: when the \
controller, woken as the launcher ends, has read the launch's result.

| latency | median s | max s |
| --- | --- | --- |
{times}

Tiny managed jobs (`run: echo done`) submitted at once on the Local provider; each gets a cluster of its own \
(one worker process), brought up by a launcher process (at most 8 at once) and torn down when the job ends. \
Submit → RUNNING is read from each job's record and includes the wait behind the launches already under way.

| jobs | succeeded | submitting all s | submit → RUNNING s (min / p50 / p90) | all ended s | controller RSS MiB (idle → peak) | KiB per job | controller threads (max) |
| --- | --- | --- | --- | --- | --- | --- | --- |
{rows}

The controller runs one loop and a pool of 8 threads for looks and teardowns, whatever the number of jobs: \
its memory grows with the jobs' records it reads each round, not with a thread or process per job (the threads counted include the short-lived ones a look starts per node)."""


if __name__ == "__main__":
    run_section(OWNER, __doc__, "managed_jobs", measure, section)
