"""Skyward against its peers and the physical floor, in one run; writes ``docs/benchmarks.md``.

    python bench/run.py              # everything (~10 minutes on 2 cores; run it on a quiet machine)
    python bench/run.py --quick      # a smoke test: every case once, tiny sizes; figures are noise
    python bench/run.py --only roundtrip,ssh --out /tmp/benchmarks.md

Every case runs in a fresh process (``cases.py``), repetitions interleaved across systems
(A B C, C B A, ...). Every figure is reported as a ratio to a baseline measured in the same run,
next to the load average. Skyward is driven only through its public API; the baselines are
self-contained in ``cases.py``. Needs numpy and torch; the peers come from the ``bench`` extra
(``pip install -e ".[bench]"``: ray, dask[distributed]): a peer that is not installed is reported
as such. The SSH section needs root (test hosts in network namespaces, see
``tests/hosts/testhosts.py``) and a package index once, for the hosts' wheelhouse.
Raw samples: ``bench/results/latest.json``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from _common import by_system, hosts_wheelhouse, loadavg, machine, parse_result, percentile

RESULTS = os.path.join(HERE, "results")
#: Cases import the skyward of this checkout (not whichever one is installed), and so do their workers.
CASE_ENV = dict(os.environ, PYTHONUNBUFFERED="1",
                PYTHONPATH=os.pathsep.join([ROOT, *filter(None, [os.environ.get("PYTHONPATH")])]))
SECTIONS = ("roundtrip", "throughput", "payload", "start", "ddp", "ssh")
PEERS = [p for p, module in (("ray", "ray"), ("dask", "distributed")) if importlib.util.find_spec(module)]


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run_case(name: str, params: dict[str, Any], *, timeout: float = 300) -> Any:
    """Run one case in a fresh interpreter: its result, or {"error": ...} if it failed."""
    cmd = [sys.executable, os.path.join(HERE, "cases.py"), name, json.dumps(params)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env=CASE_ENV, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # this case's own process group only
        out, err = proc.communicate()
        log(f"  {name} timed out after {timeout:g}s")
        return {"error": f"timed out after {timeout:g}s", "stderr": err[-2000:]}
    if proc.returncode != 0:
        log(f"  {name} failed (exit {proc.returncode}): {err.strip().splitlines()[-1:]}")
        return {"error": f"exit {proc.returncode}", "stderr": err[-4000:]}
    try:
        return parse_result(out)
    except ValueError as exc:
        return {"error": str(exc), "stderr": err[-4000:]}


def skyward_from() -> str:
    """Where the cases import skyward from."""
    return subprocess.run([sys.executable, "-c", "import skyward; print(skyward.__file__)"], capture_output=True,
                          text=True, env=CASE_ENV, check=False).stdout.strip()


def ok(result: Any) -> bool:
    return isinstance(result, dict) and "error" not in result


# -- the sections: raw measurements ---------------------------------------------------------------


@dataclass
class Plan:
    quick: bool
    notes: list[str] = field(default_factory=list)

    def pick(self, full: Any, quick: Any) -> Any:
        return quick if self.quick else full

    def run(self, what: str, case: str, params: dict[str, Any], timeout: float = 300) -> dict | None:
        """The case's result, or None (and a note on the page) if it failed."""
        r = run_case(case, params, timeout=timeout)
        if ok(r):
            return r
        self.notes.append(f"{what} failed: {r.get('error')} {str(r.get('stderr', ''))[-300:]}".strip())
        return None


def _interleaved(plan: Plan, title: str, params: dict[str, Any], jobs: dict[str, tuple[str, dict]],
                 timeout: float = 300) -> dict[str, Any]:
    """``params["reps"]`` repetitions of every job (case, params), each in a fresh process, the order
    reversed every other repetition (A B C, C B A, ...). Keeps each repetition's results by job."""
    reps: list[dict[str, Any]] = []
    load = []
    order = list(jobs)
    for rep in range(params["reps"]):
        log(f"{title}: repetition {rep + 1}/{params['reps']}")
        load.append(loadavg()[0])
        reps.append({})
        for key in order if rep % 2 == 0 else order[::-1]:
            if (r := plan.run(f"{title}: {key}", *jobs[key], timeout=timeout)) is not None:
                reps[-1][key] = r
    return {"reps": reps, "load": load, "params": params}


def section_roundtrip(plan: Plan) -> dict[str, Any]:
    p = {"reps": plan.pick(5, 1), "calls": plan.pick(300, 50), "blocks": plan.pick(10, 3),
         "peer_calls": plan.pick(800, 50), "warmup": plan.pick(200, 20)}
    # floor, ProcessPoolExecutor and Skyward in one process; Ray and Dask (daemons) each in their own
    jobs = {"local": ("rt", {"systems": ["floor", "ppe", "skyward"], "calls": p["calls"], "blocks": p["blocks"],
                             "warmup": p["warmup"]})}
    jobs.update({s: ("rt", {"systems": [s], "calls": p["peer_calls"], "blocks": 1, "warmup": p["warmup"]})
                 for s in PEERS})
    return _interleaved(plan, "round trip", p, jobs)


def section_throughput(plan: Plan) -> dict[str, Any]:
    p = {"reps": plan.pick(3, 1), "n": plan.pick(10_000, 1_000), "batches": plan.pick(3, 1),
         "warmup_n": plan.pick(1000, 100)}
    jobs = {"local": ("tp", {"systems": ["floor", "ppe", "skyward"], "n": p["n"], "batches": p["batches"],
                             "warmup_n": p["warmup_n"]})}
    jobs.update({s: ("tp", {"systems": [s], "n": p["n"], "batches": 1, "warmup_n": p["warmup_n"]})
                 for s in PEERS})
    return _interleaved(plan, "throughput", p, jobs)


def section_payload(plan: Plan) -> dict[str, Any]:
    p = {"reps": plan.pick(3, 1), "sizes": plan.pick([1, 64, 512], [1]),
         "trips": plan.pick({"1": 20, "64": 4, "512": 2}, {"1": 2})}
    if plan.quick:
        plan.notes.append("--quick: the payload was measured at 1 MiB only (no 512 MiB figure).")
    return _interleaved(plan, "payload", p, {f"{s}.{mib}": (f"pl_{s}", {"mib": mib, "trips": p["trips"][str(mib)]})
                                             for mib in p["sizes"] for s in ("floor", "skyward")})


def section_start(plan: Plan) -> dict[str, Any]:
    p = {"reps": plan.pick(5, 1), "nodes": 4}
    return _interleaved(plan, "pool start", p, {s: ("st", {"system": s, "nodes": 4})
                                                for s in ["floor", "ppe", "skyward", *PEERS]})


def section_ddp(plan: Plan) -> dict[str, Any]:
    run = plan.pick({"steps": 60, "windows": 4, "warmup": 10}, {"steps": 5, "windows": 2, "warmup": 2})
    jobs = {s: (f"ddp_{s}", run) for s in ("torchrun", "skyward")}
    # 2 nodes x 2 processes: two torchrun launchers (--node_rank 0 and 1) against processes_per_node=2
    jobs.update({f"{s}_2x2": (f"ddp_{s}", dict(run, nodes=2, procs=2)) for s in ("torchrun", "skyward")})
    d = _interleaved(plan, "DDP", dict(run, reps=plan.pick(3, 1)), jobs, timeout=400)
    for s, runs in by_system(d).items():
        if any(r.get("exit_code") for r in runs):
            plan.notes.append(f"DDP under {s}: a launch exited with an error after rank 0 had reported its "
                              "timed windows (kept).")
    return d


def section_ssh(plan: Plan) -> dict[str, Any]:
    """On SSH test hosts: pool start (cold, new image, warm) on 2, then bulk transfer and round trip on 1."""
    sys.path.insert(0, ROOT)
    try:
        from tests.hosts import testhosts
    except ImportError as exc:
        return {"unavailable": f"tests/hosts/testhosts.py cannot be imported: {exc}"}
    why = testhosts.unavailable_reason()
    if why:
        return {"unavailable": why}
    p = {"cold": plan.pick(2, 1), "new_image": plan.pick(2, 1), "warm": plan.pick(4, 1),
         "sizes": plan.pick([1, 64, 512], [1]), "trips": plan.pick(4, 1),
         "rt_calls": plan.pick(200, 30), "rt_blocks": plan.pick(10, 2), "rt_warmup": plan.pick(50, 5)}
    out: dict[str, Any] = {"cold": [], "new_image": [], "warm": [], "load": [], "params": p}
    try:
        wheelhouse = hosts_wheelhouse()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        return {"unavailable": str(exc)}
    with testhosts.claim_slot(prefix="skyp") as slot:  # the slots test sessions use: no clashes
        testhosts.down(prefix=slot.prefix)  # leftovers of a crashed run in this slot
        try:
            hosts = testhosts.up(2, prefix=slot.prefix, subnet=slot.subnet)
            hj = [{"ip": h.ip, "user": h.user, "key_path": h.key_path, "known_hosts_all": h.known_hosts_all,
                   "ssh_argv": h.ssh_argv()} for h in hosts]
            warm_tag = f"warm-{uuid.uuid4().hex}"
            # cold: fresh hosts (skyward's directory and uv's cache wiped) and a new image; new image:
            # used hosts, an image not built there; warm: an image built there before. In that order
            # (wiping makes interleaving impossible); the last new image is the one the rest reuses.
            seq = [("cold", f"cold-{uuid.uuid4().hex}") for _ in range(p["cold"])]
            seq += [("new_image", f"new-{uuid.uuid4().hex}") for _ in range(p["new_image"] - 1)]
            seq += [("new_image", warm_tag)] + [("warm", warm_tag)] * p["warm"]
            out["load"].append(loadavg()[0])
            for k, (kind, tag) in enumerate(seq):
                log(f"SSH pool start: {kind} ({k + 1}/{len(seq)})")
                if kind == "cold":
                    for h in hosts:
                        h.run("rm -rf ~/.skyward ~/.cache/uv", timeout=60)
                if r := plan.run(f"an SSH {kind} start", "ssh_start", {"hosts": hj, "wheelhouse": wheelhouse,
                                                                        "image_tag": tag}):
                    out[kind].append(r)
            common = {"host": hj[0], "wheelhouse": wheelhouse, "image_tag": warm_tag}
            log("SSH bulk transfer, then round trip")
            out["load"].append(loadavg()[0])
            if r := plan.run("the SSH bulk transfer", "ssh_payload", dict(common, sizes=p["sizes"], trips=p["trips"]),
                             timeout=400):
                out["payload"] = r["gbps"]
            if r := plan.run("the SSH round trip", "ssh_rt", dict(common, calls=p["rt_calls"], blocks=p["rt_blocks"],
                                                                 warmup=p["rt_warmup"])):
                out["rt"] = r["blocks"]
        finally:
            testhosts.down(prefix=slot.prefix)
    return out


# -- figures and targets ----------------------------------------------------------------------------


@dataclass
class Figure:
    """One reported number: its per-repetition values and its ratio to a reference measured beside it."""

    label: str
    unit: str
    reps: list[float]
    ref: Figure | None = None
    ratio_reps: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return percentile(self.reps, 50)

    def q(self, p: float) -> float:
        return percentile(self.reps, p)

    def against(self, ref: Figure | None) -> Figure:
        """The ratio is the median of per-repetition ratios, each against the reference measured next to it."""
        self.ref = ref
        if ref is not None and self.reps and len(ref.reps) == len(self.reps):
            self.ratio_reps = [a / b for a, b in zip(self.reps, ref.reps, strict=True) if b]
        elif ref is not None and self.reps and ref.reps:
            self.ratio_reps = [self.median / ref.median]
        return self

    @property
    def ratio(self) -> float:
        return percentile(self.ratio_reps, 50)


LABELS = {"floor": "raw pipe floor", "skyward": "Skyward", "ppe": "ProcessPoolExecutor", "ray": "Ray",
          "dask": "Dask distributed", "torchrun": "torchrun", "cat": "`ssh host cat` echo"}


def figures(data: dict[str, Any]) -> dict[str, Figure]:
    figs: dict[str, Figure] = {}

    def add(key: str, system: str, unit: str, reps: list[float], ref: str | None = None) -> None:
        # A reference names itself as ``ref``: it is not in ``figs`` yet, so it gets no ratio.
        if reps:
            figs[key] = Figure(LABELS.get(system, system), unit, reps).against(figs.get(ref) if ref else None)

    def vs_ray(prefix: str, unit: str) -> None:
        if f"{prefix}.skyward" in figs and f"{prefix}.ray" in figs:
            add(f"{prefix}.skyward/ray", "Skyward ÷ Ray", unit, figs[f"{prefix}.skyward"].reps, f"{prefix}.ray")

    if "roundtrip" in data:
        blocks = by_system(data["roundtrip"], "blocks")
        for q in (50, 99):
            for s in ["floor", "ppe", "skyward", "ray", "dask"]:
                samples = [[x for b in r for x in b] for r in blocks.get(s, [])]  # one list per repetition
                add(f"rt{q}.{s}", s, "µs", [percentile(x, q) * 1e6 for x in samples], f"rt{q}.floor")
            vs_ray(f"rt{q}", "µs")
    if "throughput" in data:
        rates = by_system(data["throughput"], "rates")
        for s in ["floor", "skyward", "ppe", "ray", "dask"]:
            add(f"tp.{s}", s, "tasks/s", [percentile(r, 50) for r in rates.get(s, [])], "tp.floor")
        vs_ray("tp", "tasks/s")
    if "payload" in data:
        runs = by_system(data["payload"])
        for mib in data["payload"]["params"]["sizes"]:
            for s in ("floor", "skyward"):
                rs = runs.get(f"{s}.{mib}", [])
                add(f"pl.{s}.{mib}", s, "GB/s", [percentile(r["gbps"], 50) for r in rs], f"pl.floor.{mib}")
                add(f"mem.{s}.{mib}", s, "× payload", [r["peak_over_baseline"] / r["nbytes"] for r in rs],
                    f"mem.floor.{mib}")
    if "start" in data:
        runs = by_system(data["start"])
        for s in ["floor", "ppe", "skyward", "dask", "ray"]:
            add(f"st.{s}", s, "s", [r["first"] for r in runs.get(s, [])], "st.floor")
            add(f"stop.{s}", s, "s", [r["stop"] for r in runs.get(s, [])] if s != "floor" else [])
        vs_ray("st", "s")
    if "ddp" in data:
        runs = by_system(data["ddp"])
        for s in ("torchrun", "skyward"):
            add(f"ddp.{s}", s, "steps/s", [percentile(r["steps_per_s"], 50) for r in runs.get(s, [])], "ddp.torchrun")
            add(f"ddpwall.{s}", s, "s", [r["wall"] for r in runs.get(s, [])], "ddpwall.torchrun")
            k = f"{s}_2x2"
            add(f"ddp.{k}", f"{s}, 2 nodes × 2 processes", "steps/s",
                [percentile(r["steps_per_s"], 50) for r in runs.get(k, [])], "ddp.torchrun_2x2")
    d = data.get("ssh", {})
    for kind, label in (("cold", "cold: fresh hosts, new image"), ("new_image", "new image, used hosts"),
                        ("warm", "warm: same image again")):
        add(f"sst.{kind}", label, "s", [x["first"] for x in d.get(kind, [])])
    for size in d["params"]["sizes"] if d.get("payload") else []:
        add(f"ssh.openssh.{size}", "OpenSSH `cat > /dev/null`", "GB/s", d["payload"]["openssh"][str(size)])
        add(f"ssh.skyward.{size}", "skyward", "GB/s", d["payload"]["skyward"][str(size)], f"ssh.openssh.{size}")
    if d.get("rt"):
        # one process, alternating blocks: a block is a repetition, and the ratio is paired block by block
        add("sshrt.cat", "cat", "µs", [percentile(b, 50) * 1e6 for b in d["rt"]["cat"]])
        add("sshrt.skyward", "skyward", "µs", [percentile(b, 50) * 1e6 for b in d["rt"]["skyward"]], "sshrt.cat")
    return figs


@dataclass
class Target:
    text: str
    value: float  # the measured quantity the target is about (nan: not measured)
    shown: str
    limit: float | None  # None: reported, no target
    at_most: bool = True

    @property
    def verdict(self) -> str:
        if math.isnan(self.value):
            return "not measured"
        if self.limit is None:
            return "(no target)"
        passed = self.value <= self.limit if self.at_most else self.value >= self.limit
        return "**PASS**" if passed else "**MISS**"


def targets(figs: dict[str, Figure], data: dict[str, Any]) -> list[Target]:
    nan = math.nan

    def ratio(key: str) -> float:
        f = figs.get(key)
        return f.ratio if f is not None and f.ratio_reps else nan

    def median(key: str) -> float:
        f = figs.get(key)
        return f.median if f is not None else nan

    def fmt(v: float, pattern: str) -> str:
        return "not measured" if math.isnan(v) else pattern.format(v)

    out = []
    r, text = ratio("rt50.skyward"), None
    blocks = by_system(data["roundtrip"], "blocks") if "roundtrip" in data else {}
    if blocks.get("floor") and blocks.get("skyward"):
        # The floor is bimodal (two processes on one CPU or on two; see the method notes): judge
        # against its fastest block whenever that is the stricter reading.
        strict = (percentile([percentile(b, 50) for r_ in blocks["skyward"] for b in r_], 50)
                  / min(percentile(b, 50) for r_ in blocks["floor"] for b in r_))
        if math.isnan(r) or strict > r:
            text = f"{strict:.2f}× against the floor's fastest block ({r:.2f}× against its median)"
            r = strict
    out.append(Target("no-op round trip (p50) ≤ 3× the raw pipe floor", r, text or fmt(r, "{:.2f}×"), 3.0))
    r = ratio("rt50.skyward/ray")
    out.append(Target("no-op round trip (p50) ≤ 0.25× Ray's", r, fmt(r, "{:.3f}×"), 0.25))
    n = data.get("throughput", {}).get("params", {}).get("n", 10_000)
    v = median("tp.skyward")
    out.append(Target(f"≥ 20,000 tiny tasks/s ({n:,} gathered, 2 nodes)", v, fmt(v, "{:,.0f} tasks/s"), 20_000,
                      at_most=False))
    r = ratio("pl.skyward.512")
    out.append(Target("512 MiB payload at ≥ 50 % of the raw pipe floor's GB/s", r, fmt(r * 100, "{:.0f} %"), 0.5,
                      at_most=False))
    v = median("mem.skyward.512")
    out.append(Target("client peak memory ≤ 3× the payload (512 MiB)", v, fmt(v, "{:.2f}×"), 3.0))
    v = median("st.skyward")
    out.append(Target("Local 4-node pool to first result ≤ 1 s", v, fmt(v, "{:.3f} s"), 1.0))
    r = ratio("ddp.skyward")
    out.append(Target("DDP steps/s ≥ 0.98× torchrun's", r, fmt(r, "{:.3f}×"), 0.98, at_most=False))
    r = ratio("ddp.skyward_2x2")
    out.append(Target("DDP, 2 nodes × 2 processes: steps/s ≥ 0.98× torchrun --nnodes 2 --nproc_per_node 2", r,
                      fmt(r, "{:.3f}×"), 0.98, at_most=False))
    sizes = (data.get("ssh", {}).get("params") or {}).get("sizes") or [512]
    r = ratio(f"ssh.skyward.{sizes[-1]}")
    out.append(Target(f"over SSH, bulk transfer ({sizes[-1]} MiB) ≥ 50 % of OpenSSH's on the same link", r,
                      fmt(r * 100, "{:.0f} %"), 0.5, at_most=False))
    r = ratio("sshrt.skyward")
    out.append(Target("over SSH, no-op round trip (p50) ÷ an `ssh host cat` echo's", r, fmt(r, "{:.2f}×"), None))
    return out


# -- main -------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: every case once with tiny sizes (~2 minutes); figures are noise")
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections: {', '.join(SECTIONS)}")
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks.md"),
                        help="the page to write")
    parser.add_argument("--report-only", action="store_true",
                        help="measure nothing: rewrite the page from bench/results/latest.json")
    args = parser.parse_args()
    from report import write_report

    if args.report_only:
        with open(os.path.join(RESULTS, "latest.json")) as f:
            saved = json.load(f)
        figs = figures(saved["data"])
        write_report(args.out, saved["meta"], saved["data"], figs, targets(figs, saved["data"]))
        log(f"rewrote {args.out} from bench/results/latest.json")
        return 0
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    if unknown := [s for s in only if s not in SECTIONS]:
        parser.error(f"unknown section(s) {unknown}; choose from {', '.join(SECTIONS)}")

    plan = Plan(args.quick)
    for p in {"ray", "dask"} - set(PEERS):
        plan.notes.append(f"{p} is not installed (`pip install -e '.[bench]'`): left out of every section.")
    started = time.time()
    info = machine()
    info["skyward_from"] = skyward_from()
    runners = {"roundtrip": section_roundtrip, "throughput": section_throughput, "payload": section_payload,
               "start": section_start, "ddp": section_ddp, "ssh": section_ssh}
    data: dict[str, Any] = {}
    seconds = {}
    for name in SECTIONS:
        if name in only:
            t = time.time()
            try:
                data[name] = runners[name](plan)
            except Exception as exc:  # noqa: BLE001  (one broken section must not cost the others)
                log(f"{name} failed: {exc!r}")
                plan.notes.append(f"The {name} section failed: {type(exc).__name__}: {exc}")
            seconds[name] = time.time() - t
            log(f"{name} done in {seconds[name]:.0f}s")

    info["loadavg_at_end"] = loadavg()
    command = "python bench/run.py" + (" --quick" if args.quick else "") + (
        f" --only {','.join(only)}" if set(only) != set(SECTIONS) else "")
    meta = {"machine": info, "command": command, "elapsed_s": time.time() - started, "section_seconds": seconds,
            "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"), "quick": args.quick,
            "notes": plan.notes}
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "latest.json"), "w") as f:
        json.dump({"meta": meta, "data": data}, f)
    figs = figures(data)
    tgts = targets(figs, data)
    write_report(args.out, meta, data, figs, tgts)
    log(f"wrote {args.out} in {meta['elapsed_s']:.0f}s")
    for t in tgts:
        log(f"  {t.verdict.strip('*'):12s} {t.text}: {t.shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
