"""Skyward against its peers and the physical floor, in one run: ``python bench/run.py [--quick]``.

Runs every measurement (each in a fresh process, see ``cases.py``), repetitions interleaved
across systems (A B C A B C ...), then profiles the figures furthest from their targets and
writes ``docs/benchmarks.md`` with tables, PNG plots (``docs/img/bench/``), the machine's
details and the command that reproduces it. Raw samples and profiles go to ``bench/results/``.

Needs the ``bench`` extra (``pip install -e ".[bench]"``: matplotlib, ray, dask[distributed]),
numpy and torch; py-spy for the profiles (``pip install py-spy``). A peer that is not
installed is reported as such, not skipped silently.

Options: ``--quick`` (fewer repetitions, no 512 MiB payload, shorter profiles: ~3 minutes),
``--only SECTION[,SECTION]`` (roundtrip, throughput, payload, start, ddp), ``--no-profile``,
``--out PATH`` (the markdown file).
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
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from _common import machine, parse_result, percentile  # noqa: E402

RESULTS = os.path.join(HERE, "results")
SECTIONS = ("roundtrip", "throughput", "payload", "start", "ddp", "ssh")


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def loadavg() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return math.nan


# -- running cases ---------------------------------------------------------------------------------


def run_case(name: str, params: dict[str, Any], *, timeout: float = 300, env: dict[str, str] | None = None,
             prefix: tuple[str, ...] = ()) -> Any:
    """Run one case in a fresh interpreter; its result, or {"error": ...} if it failed."""
    cmd = [*prefix, sys.executable, os.path.join(HERE, "cases.py"), name, json.dumps(params)]
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env=full_env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # this case's own process group only
        out, err = proc.communicate()
        log(f"  {name} timed out after {timeout:g}s")
        return {"error": f"timed out after {timeout:g}s", "stderr": err[-2000:]}
    if proc.returncode != 0:
        log(f"  {name} failed (exit {proc.returncode}): {err.strip().splitlines()[-1:] if err.strip() else ''}")
        return {"error": f"exit {proc.returncode}", "stderr": err[-4000:]}
    try:
        return parse_result(out)
    except ValueError as exc:
        return {"error": str(exc), "stderr": err[-4000:]}


def ok(result: Any) -> bool:
    return isinstance(result, dict) and "error" not in result


def have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


# -- figures ---------------------------------------------------------------------------------------


@dataclass
class Figure:
    """One reported number: per-repetition values, summarized, plus its ratio to a reference."""

    key: str
    label: str
    unit: str
    reps: list[float]
    higher_is_better: bool
    note: str = ""
    ref: Figure | None = None
    ratio_reps: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return percentile(self.reps, 50)

    @property
    def p10(self) -> float:
        return percentile(self.reps, 10)

    @property
    def p90(self) -> float:
        return percentile(self.reps, 90)

    def against(self, ref: Figure | None) -> Figure:
        """Set the reference; the ratio is the median of per-repetition ratios (paired in time)."""
        self.ref = ref
        if ref is None or not self.reps or not ref.reps:
            self.ratio_reps = []
        elif len(ref.reps) == len(self.reps):
            self.ratio_reps = [a / b for a, b in zip(self.reps, ref.reps, strict=True) if b]
        else:
            self.ratio_reps = [self.median / ref.median] if ref.median else []
        return self

    @property
    def ratio(self) -> float:
        return percentile(self.ratio_reps, 50)


@dataclass
class Target:
    key: str
    text: str
    value: float  # the measured quantity the target is about
    shown: str  # how the measured value is written
    limit: float
    at_most: bool  # True: value <= limit passes
    section: str

    @property
    def passed(self) -> bool:
        if math.isnan(self.value):
            return False
        return self.value <= self.limit if self.at_most else self.value >= self.limit

    @property
    def distance(self) -> float:
        """How far from the target (>1: missed by that factor; <1: met with that much to spare)."""
        if math.isnan(self.value) or self.value <= 0:
            return math.inf
        return self.value / self.limit if self.at_most else self.limit / self.value


# -- sections --------------------------------------------------------------------------------------


@dataclass
class Plan:
    quick: bool

    def pick(self, full: Any, quick: Any) -> Any:
        return quick if self.quick else full


def section_roundtrip(plan: Plan, notes: list[str]) -> dict[str, Any]:
    reps = plan.pick(5, 2)
    calls, blocks = plan.pick(300, 250), plan.pick(10, 6)
    peer_calls = plan.pick(800, 400)
    local = ["floor", "floor_spin", "floor_server_hop", "floor_client_hop", "floor_both_hops", "ppe", "skyward",
             "skyward_nospin"]
    peers = [p for p, mod in (("ray", "ray"), ("dask", "distributed")) if have(mod)]
    for p, mod in (("ray", "ray"), ("dask", "distributed")):
        if not have(mod):
            notes.append(f"{p} is not installed (`pip install -e '.[bench]'`): left out of every section.")
    raw: dict[str, list[list[float]]] = {s: [] for s in local + peers}
    per_call: dict[str, list[dict[str, float]]] = {}
    block_p50: dict[str, list[float]] = {}
    load = []
    for rep in range(reps):
        log(f"round trip: repetition {rep + 1}/{reps}")
        load.append(loadavg())
        order = ["local"] + peers if rep % 2 == 0 else peers[::-1] + ["local"]
        for what in order:
            if what == "local":
                r = run_case("rt_local", {"systems": local, "calls": calls, "blocks": blocks, "warmup": 200})
                if ok(r):
                    for s in local:
                        raw[s].append([x for block in r["blocks"][s] for x in block])
                        block_p50.setdefault(s, []).extend(percentile(b, 50) for b in r["blocks"][s])
                        per_call.setdefault(s, []).append(r["per_call"][s])
            else:
                r = run_case(f"rt_{what}", {"calls": peer_calls, "warmup": 100})
                if ok(r):
                    raw[what].append(r["samples"])
    # Diagnostic: the same, every thread and process pinned to one CPU, so that no hand-off has to
    # wake another CPU (see "What bounds it").
    pinned: dict[str, list[float]] = {}
    import shutil

    if shutil.which("taskset") and (os.cpu_count() or 1) > 1:
        log("round trip: once more, pinned to CPU 0 (diagnostic)")
        r = run_case("rt_local", {"systems": ["floor", "floor_both_hops", "skyward", "skyward_nospin"], "calls": calls,
                                  "blocks": blocks, "warmup": 200}, prefix=("taskset", "-c", "0"))
        if ok(r):
            pinned = {s: [percentile(b, 50) for b in blocks_] for s, blocks_ in r["blocks"].items()}
    return {"raw": raw, "per_call": per_call, "block_p50": block_p50, "pinned_block_p50": pinned, "load": load,
            "params": {"reps": reps, "calls_per_block": calls, "blocks": blocks, "peer_calls": peer_calls}}


def section_throughput(plan: Plan, notes: list[str]) -> dict[str, Any]:
    reps = plan.pick(3, 1)
    n = 10_000
    local = ["floor", "ppe", "skyward"]
    peers = [p for p, mod in (("ray", "ray"), ("dask", "distributed")) if have(mod)]
    raw: dict[str, list[list[float]]] = {s: [] for s in local + peers}
    load = []
    for rep in range(reps):
        log(f"throughput: repetition {rep + 1}/{reps}")
        load.append(loadavg())
        order = ["local"] + peers if rep % 2 == 0 else peers[::-1] + ["local"]
        for what in order:
            if what == "local":
                r = run_case("tp_local", {"systems": local, "n": n, "batches": 3, "warmup_n": 1000})
                if ok(r):
                    for s in local:
                        raw[s].append(r["rates"][s])
            else:
                r = run_case(f"tp_{what}", {"n": n, "batches": 1, "warmup_n": 500}, timeout=240)
                if ok(r):
                    raw[what].append(r["rates"])
    return {"raw": raw, "load": load, "params": {"reps": reps, "n": n}}


def section_payload(plan: Plan, notes: list[str]) -> dict[str, Any]:
    sizes = plan.pick([1, 64, 512], [1, 64])
    trips = {1: 20, 64: 4, 512: 2}
    reps = plan.pick(3, 2)
    raw: dict[str, dict[int, list[dict]]] = {"floor": {s: [] for s in sizes}, "skyward": {s: [] for s in sizes}}
    load = []
    for rep in range(reps):
        log(f"payload: repetition {rep + 1}/{reps}")
        load.append(loadavg())
        for size in sizes:
            for system in (["floor", "skyward"] if rep % 2 == 0 else ["skyward", "floor"]):
                r = run_case(f"pl_{system}", {"mib": size, "trips": trips[size]})
                if ok(r):
                    raw[system][size].append(r)
    if plan.quick:
        notes.append("--quick: the 512 MiB payload (and so its memory figure) was not measured.")
    return {"raw": raw, "load": load, "params": {"reps": reps, "sizes": sizes, "trips": trips}}


def section_start(plan: Plan, notes: list[str]) -> dict[str, Any]:
    reps = plan.pick(5, 2)
    systems = ["floor", "ppe", "skyward"] + [p for p, mod in (("ray", "ray"), ("dask", "distributed")) if have(mod)]
    raw: dict[str, list[dict]] = {s: [] for s in systems}
    load = []
    for rep in range(reps):
        log(f"pool start: repetition {rep + 1}/{reps}")
        load.append(loadavg())
        for s in systems if rep % 2 == 0 else systems[::-1]:
            r = run_case(f"st_{s}", {"nodes": 4})
            if ok(r):
                raw[s].append(r)
    return {"raw": raw, "load": load, "params": {"reps": reps, "nodes": 4}}


WHEELHOUSE_REQUIREMENTS = ("uv", "cloudpickle>=2.1", "pydantic>=2.5", "rich>=13")


def _wheelhouse() -> str:
    """Wheels for the SSH test hosts (they cannot reach an index), downloaded once into /tmp."""
    import hashlib
    import platform

    key = hashlib.sha256(json.dumps([WHEELHOUSE_REQUIREMENTS, sys.version_info[:2], platform.machine()])
                         .encode()).hexdigest()[:12]
    directory = os.path.join("/tmp/skyward-bench-wheelhouse", key)
    if os.path.exists(os.path.join(directory, ".complete")):
        return directory
    staging = f"{directory}.{os.getpid()}.partial"
    done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", staging,
                           *WHEELHOUSE_REQUIREMENTS], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError("pip download of the hosts' wheelhouse failed: " + done.stderr[-500:])
    open(os.path.join(staging, ".complete"), "w").close()
    try:
        os.rename(staging, directory)
    except OSError:
        subprocess.run(["rm", "-rf", staging], check=False)
    return directory


def ssh_unavailable() -> str | None:
    """Why the SSH measurements cannot run here, or None."""
    if not have("skyward.providers.ssh"):
        return "`skyward/providers/ssh.py` does not exist yet"
    sys.path.insert(0, ROOT)
    try:
        from tests.hosts import testhosts
    except ImportError as exc:
        return f"the SSH test hosts (tests/hosts/testhosts.py) cannot be imported: {exc}"
    reason = testhosts.unavailable_reason() or (
        f"missing {', '.join(testhosts._missing_tools())}" if testhosts._missing_tools() else None)
    return f"SSH test hosts cannot be made here: {reason}" if reason else None


def section_ssh(plan: Plan, notes: list[str]) -> dict[str, Any]:
    """Pool start (cold, warm) on 2 SSH test hosts, and bulk transfer to one against OpenSSH."""
    import uuid

    why = ssh_unavailable()
    if why:
        notes.append(f"SSH figures not measured: {why}.")
        return {"unavailable": why}
    from tests.hosts import testhosts

    wheelhouse = _wheelhouse()
    cold_reps, new_reps, warm_reps = plan.pick(2, 1), plan.pick(2, 1), plan.pick(4, 2)
    sizes = plan.pick([1, 64, 512], [1, 64])
    out: dict[str, Any] = {"cold": [], "new_image": [], "warm": [], "payload": None, "load": [],
                           "params": {"cold_reps": cold_reps, "new_reps": new_reps, "warm_reps": warm_reps,
                                      "sizes": sizes}}
    with testhosts.claim_slot(prefix="skyp") as slot:  # the same slots as test sessions: no clashes
        testhosts.down(prefix=slot.prefix)
        try:
            hosts = testhosts.up(2, prefix=slot.prefix, subnet=slot.subnet)
            hj = [{"ip": h.ip, "user": h.user, "key_path": h.key_path, "known_hosts_all": h.known_hosts_all,
                   "ssh_argv": h.ssh_argv()} for h in hosts]
            warm_tag = f"warm-{uuid.uuid4().hex}"
            out["load"].append(loadavg())
            # cold: a fresh host (skyward's directory and uv's cache wiped first) and a new image;
            # new image: the host has been used (wheel, uv and its cache there) but not this image;
            # warm: an image the host has built before.
            sequence = [("cold", f"cold-{uuid.uuid4().hex}") for _ in range(cold_reps)]
            sequence += [("new_image", f"new-{uuid.uuid4().hex}") for _ in range(new_reps - 1)]
            sequence += [("new_image", warm_tag)] + [("warm", warm_tag)] * warm_reps
            for k, (kind, tag) in enumerate(sequence):
                log(f"SSH pool start: {kind} ({k + 1}/{len(sequence)})")
                if kind == "cold":
                    for h in hosts:
                        rc, _, err = h.run("rm -rf ~/.skyward ~/.cache/uv", timeout=60)
                        if rc != 0:
                            notes.append(f"could not wipe {h.name} before a cold start: {err.strip()[:200]}")
                r = run_case("ssh_start", {"hosts": hj, "wheelhouse": wheelhouse, "image_tag": tag}, timeout=300)
                if ok(r):
                    out[kind].append(r)
                else:
                    notes.append(f"an SSH {kind} start failed: {r.get('error')} {r.get('stderr', '')[-300:]}")
            log("SSH payload")
            out["load"].append(loadavg())
            r = run_case("ssh_payload", {"host": hj[0], "wheelhouse": wheelhouse, "image_tag": warm_tag,
                                         "sizes": sizes, "trips": plan.pick(4, 2)}, timeout=400)
            if ok(r):
                out["payload"] = r["gbps"]
            else:
                notes.append(f"the SSH payload case failed: {r.get('error')} {r.get('stderr', '')[-300:]}")
        finally:
            testhosts.down(prefix=slot.prefix)
    return out


DDP_PARAMS = {"steps": 60, "windows": 4, "warmup": 10}


def section_ddp(plan: Plan, notes: list[str]) -> dict[str, Any]:
    reps = plan.pick(3, 1)
    raw: dict[str, list[dict]] = {"torchrun": [], "skyward": []}
    if not have("torch"):
        notes.append("torch is not installed: the distributed training section was not measured.")
        return {"raw": raw, "load": [], "params": {}}
    load = []
    for rep in range(reps):
        log(f"DDP: repetition {rep + 1}/{reps}")
        load.append(loadavg())
        for s in ["torchrun", "skyward"] if rep % 2 == 0 else ["skyward", "torchrun"]:
            r = run_case(f"ddp_{s}", DDP_PARAMS, timeout=400)
            if not ok(r):
                notes.append(f"DDP under {s} failed once and was run again: {str(r.get('error'))[:200]}")
                r = run_case(f"ddp_{s}", DDP_PARAMS, timeout=400)
            if ok(r):
                raw[s].append(r)
                if r.get("exit_code"):
                    notes.append(f"DDP under {s}: the launch exited with {r['exit_code']} after rank 0 had "
                                 "reported its timed windows (kept).")
    return {"raw": raw, "load": load, "params": dict(DDP_PARAMS, reps=reps)}


# -- figures from raw data -------------------------------------------------------------------------

LABELS = {
    "floor": "raw pipe floor",
    "floor_server_hop": "floor + serving-side thread hand-off",
    "floor_client_hop": "floor + caller-side reader thread and Future",
    "floor_both_hops": "floor + both (Skyward's old thread structure)",
    "floor_spin": "floor, both ends polling 50 µs before blocking",
    "skyward": "Skyward",
    "skyward_nospin": "Skyward, SKYWARD_SPIN_US=0",
    "ray": "Ray",
    "dask": "Dask distributed",
    "ppe": "ProcessPoolExecutor",
    "torchrun": "torchrun",
}


def figures(data: dict[str, Any]) -> dict[str, Figure]:
    figs: dict[str, Figure] = {}
    if "roundtrip" in data:
        raw = data["roundtrip"]["raw"]
        for s, runs in raw.items():
            if not runs:
                continue
            figs[f"rt50.{s}"] = Figure(f"rt50.{s}", LABELS[s], "µs", [percentile(r, 50) * 1e6 for r in runs], False)
            figs[f"rt99.{s}"] = Figure(f"rt99.{s}", LABELS[s], "µs", [percentile(r, 99) * 1e6 for r in runs], False)
        for q in ("rt50", "rt99"):
            for s in raw:
                if f"{q}.{s}" in figs and s != "floor":
                    figs[f"{q}.{s}"].against(figs.get(f"{q}.floor"))
            if f"{q}.skyward" in figs and f"{q}.ray" in figs:
                figs[f"{q}.skyward/ray"] = Figure(f"{q}.skyward/ray", "Skyward vs Ray", "µs",
                                                  figs[f"{q}.skyward"].reps, False).against(figs[f"{q}.ray"])
    if "throughput" in data:
        raw = data["throughput"]["raw"]
        for s, runs in raw.items():
            if runs:
                figs[f"tp.{s}"] = Figure(f"tp.{s}", LABELS[s], "tasks/s", [percentile(r, 50) for r in runs], True)
        for s in raw:
            if f"tp.{s}" in figs and s != "floor":
                figs[f"tp.{s}"].against(figs.get("tp.floor"))
        if "tp.skyward" in figs and "tp.ray" in figs:
            figs["tp.skyward/ray"] = Figure("tp.skyward/ray", "Skyward vs Ray", "tasks/s", figs["tp.skyward"].reps,
                                            True).against(figs["tp.ray"])
    if "payload" in data:
        raw = data["payload"]["raw"]
        for s, by_size in raw.items():
            for size, runs in by_size.items():
                size = int(size)
                if not runs:
                    continue
                figs[f"pl.{s}.{size}"] = Figure(f"pl.{s}.{size}", LABELS[s], "GB/s",
                                                [percentile(r["gbps"], 50) for r in runs], True)
                figs[f"mem.{s}.{size}"] = Figure(f"mem.{s}.{size}", LABELS[s], "× payload",
                                                 [r["peak_over_baseline"] / r["nbytes"] for r in runs], False)
        for size in data["payload"]["params"]["sizes"]:
            if f"pl.skyward.{size}" in figs:
                figs[f"pl.skyward.{size}"].against(figs.get(f"pl.floor.{size}"))
                figs[f"mem.skyward.{size}"].against(figs.get(f"mem.floor.{size}"))
    if "start" in data:
        raw = data["start"]["raw"]
        for s, runs in raw.items():
            if runs:
                figs[f"st.{s}"] = Figure(f"st.{s}", LABELS[s], "s", [r["first"] for r in runs], False)
                figs[f"stop.{s}"] = Figure(f"stop.{s}", LABELS[s], "s", [r["stop"] for r in runs], False)
        for s in raw:
            if f"st.{s}" in figs and s != "floor":
                figs[f"st.{s}"].against(figs.get("st.floor"))
        if "st.skyward" in figs and "st.ray" in figs:
            figs["st.skyward/ray"] = Figure("st.skyward/ray", "Skyward vs Ray", "s", figs["st.skyward"].reps,
                                            False).against(figs["st.ray"])
    if "ssh" in data and "unavailable" not in data["ssh"]:
        d = data["ssh"]
        for kind, label in (("cold", "cold: fresh hosts, new image"), ("new_image", "new image, used hosts"),
                            ("warm", "warm: same image again")):
            if d.get(kind):
                figs[f"sst.{kind}"] = Figure(f"sst.{kind}", label, "s", [x["first"] for x in d[kind]], False)
        for system, label in (("skyward", "Skyward"), ("openssh", "OpenSSH `cat > /dev/null`")):
            for size, vals in (d.get("payload") or {}).get(system, {}).items():
                figs[f"ssh.{system}.{size}"] = Figure(f"ssh.{system}.{size}", label, "GB/s", vals, True)
        for size in d["params"]["sizes"]:
            if f"ssh.skyward.{size}" in figs:
                figs[f"ssh.skyward.{size}"].against(figs.get(f"ssh.openssh.{size}"))
    if "ddp" in data:
        raw = data["ddp"]["raw"]
        for s, runs in raw.items():
            if runs:
                figs[f"ddp.{s}"] = Figure(f"ddp.{s}", LABELS[s], "steps/s",
                                          [percentile(r["steps_per_s"], 50) for r in runs], True)
                figs[f"ddpwall.{s}"] = Figure(f"ddpwall.{s}", LABELS[s], "s", [r["wall"] for r in runs], False)
        if "ddp.skyward" in figs:
            figs["ddp.skyward"].against(figs.get("ddp.torchrun"))
            figs["ddpwall.skyward"].against(figs.get("ddpwall.torchrun"))
    return figs


def targets(figs: dict[str, Figure], data: dict[str, Any] | None = None) -> list[Target]:
    nan = math.nan
    out = []

    def fig_ratio(key: str) -> float:
        f = figs.get(key)
        return f.ratio if f is not None and f.ratio_reps else nan

    def fig_median(key: str) -> float:
        f = figs.get(key)
        return f.median if f is not None else nan

    r = fig_ratio("rt50.skyward")
    text = f"{r:.2f}×"
    bp = ((data or {}).get("roundtrip") or {}).get("block_p50") or {}
    if bp.get("floor") and bp.get("skyward"):
        # The floor is bimodal (one CPU or two, see the page): judge against its fastest block
        # whenever that is the stricter reading.
        strict = percentile(bp["skyward"], 50) / min(bp["floor"])
        if math.isnan(r) or strict > r:
            text = f"{strict:.2f}× against the floor's fastest block ({r:.2f}× against its median)"
            r = strict
    out.append(Target("rt.floor", "no-op round trip (p50) ≤ 3× the raw pipe floor", r, text, 3.0, True,
                      "roundtrip"))
    r = fig_ratio("rt50.skyward/ray")
    out.append(Target("rt.ray", "no-op round trip (p50) ≤ 0.25× Ray's", r, f"{r:.3f}×", 0.25, True, "roundtrip"))
    v = fig_median("tp.skyward")
    out.append(Target("tp", "≥ 20,000 tiny tasks/s (10,000 gathered, 2 nodes)", v, f"{v:,.0f} tasks/s", 20_000,
                      False, "throughput"))
    r = fig_ratio("pl.skyward.512")
    out.append(Target("pl", "512 MiB payload at ≥ 50 % of the raw pipe floor's GB/s", r,
                      f"{r * 100:.0f} %" if not math.isnan(r) else "not measured", 0.5, False, "payload"))
    v = fig_median("mem.skyward.512")
    out.append(Target("mem", "client peak memory ≤ 3× the payload (512 MiB)", v,
                      f"{v:.2f}×" if not math.isnan(v) else "not measured", 3.0, True, "payload"))
    v = fig_median("st.skyward")
    out.append(Target("st", "Local 4-node pool to first result ≤ 1 s", v, f"{v:.3f} s", 1.0, True, "start"))
    r = fig_ratio("ddp.skyward")
    out.append(Target("ddp", "DDP steps/s ≥ 0.98× torchrun's", r, f"{r:.3f}×", 0.98, False, "ddp"))
    sizes = sorted(int(k.split(".")[-1]) for k in figs if k.startswith("ssh.skyward."))
    if sizes:
        r = fig_ratio(f"ssh.skyward.{sizes[-1]}")
        out.append(Target("ssh", f"over SSH, bulk transfer ({sizes[-1]} MiB) ≥ 50 % of OpenSSH's on the same link",
                          r, f"{r * 100:.0f} %", 0.5, False, "ssh"))
    return out


# -- profiling -------------------------------------------------------------------------------------


def profile(target: Target, plan: Plan) -> dict[str, Any]:
    """Profile the Skyward side of ``target``'s measurement; returns summaries of the profiles.

    Python-bound figures (round trip, throughput, start): py-spy on the client and every worker
    sampling only the thread that holds the GIL, cProfile on the client, strace's system-call
    counts, and (round trip) the stage-by-stage cost model. Payload: py-spy over all threads.
    DDP: perf on rank 0 under both launchers (native frames, every thread: OpenMP and gloo
    threads are not Python threads, so py-spy cannot see them).
    """
    import shutil

    from profiles import summarize_cprofile, summarize_perf, summarize_pyspy, summarize_strace

    out_dir = os.path.join(RESULTS, f"profile-{target.key}")
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    rt_calls = plan.pick(30000, 10000)
    recipes: dict[str, tuple[str, dict[str, Any], int]] = {  # case, params, tasks in the profiled region
        "rt.floor": ("rt_profile", {"calls": rt_calls, "warmup": 500}, rt_calls),
        "rt.ray": ("rt_profile", {"calls": rt_calls, "warmup": 500}, rt_calls),
        "tp": ("tp_profile", {"n": 10000, "batches": plan.pick(4, 2), "warmup_n": 1000}, 10000 * plan.pick(4, 2)),
        "pl": ("pl_skyward", {"mib": plan.pick(512, 64), "trips": 3}, 4),
        "mem": ("pl_skyward", {"mib": plan.pick(512, 64), "trips": 1}, 2),
        "st": ("st_skyward", {"nodes": 4}, 1),
        "ddp": ("ddp_skyward", DDP_PARAMS, 0),
        "ssh": ("ssh_payload", {}, 0),
    }
    name, params, tasks = recipes[target.key]
    summary: dict[str, Any] = {"case": name, "params": params, "dir": os.path.relpath(out_dir, ROOT)}

    def attempt(label: str, case: str, case_params: dict[str, Any], env: dict[str, str]) -> bool:
        log(f"profiling {target.key}: {label} ({case})")
        r = run_case(case, case_params, env=env, timeout=400)
        if not ok(r):
            summary[f"{label}_error"] = r.get("error")
        return ok(r)

    if target.key == "ssh":
        summary["note"] = "not profiled automatically: the test hosts are down by now"
        return summary

    if target.key == "ddp":
        if shutil.which("perf") is None:
            summary["perf_error"] = "perf is not installed"
            return summary
        d = os.path.join(out_dir, "perf")
        for launcher in ("skyward", "torchrun"):
            env = {"BENCH_PERF_DIR": d, "BENCH_PERF_NAME": launcher}
            if attempt(f"perf_{launcher}", f"ddp_{launcher}", DDP_PARAMS, env):
                path = os.path.join(d, f"{launcher}.perf.data")
                if os.path.exists(path):
                    summary[f"perf_{launcher}"] = summarize_perf(path)
        return summary

    if target.key != "st":
        if shutil.which("py-spy"):
            d = os.path.join(out_dir, "pyspy")
            flags = "--gil" if target.key in ("rt.floor", "rt.ray", "tp") else ""
            summary["pyspy_flags"] = flags or "(all threads)"
            if attempt("pyspy", name, params, {"BENCH_PROFILE": "pyspy", "BENCH_PROFILE_DIR": d,
                                               "BENCH_PYSPY_FLAGS": flags}):
                summary["pyspy"] = summarize_pyspy(d)
        else:
            summary["pyspy_error"] = "py-spy is not installed (pip install py-spy)"
    d = os.path.join(out_dir, "cprofile")
    if attempt("cprofile", name, params, {"BENCH_PROFILE": "cprofile", "BENCH_PROFILE_DIR": d}):
        summary["cprofile"] = summarize_cprofile(os.path.join(d, "client.pstats"))
        summary["cprofile_tasks"] = tasks
    if target.key in ("rt.floor", "rt.ray", "tp") and shutil.which("strace"):
        d = os.path.join(out_dir, "strace")
        small = dict(params)
        if "calls" in small:
            small["calls"] = 3000
            n = 3000
        else:
            small["batches"] = 1
            n = small["n"]
        if attempt("strace", name, small, {"BENCH_PROFILE": "strace", "BENCH_PROFILE_DIR": d}):
            summary["strace"] = summarize_strace(d, n)
    if target.key in ("rt.floor", "rt.ray"):
        r = run_case("rt_costs", {"n": 5000, "repeats": 5})
        if ok(r):
            summary["costs"] = r["costs"]
    return summary


# -- main ------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, no 512 MiB payload (~3 min)")
    parser.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections to run")
    parser.add_argument("--no-profile", action="store_true", help="skip profiling the worst figures")
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks.md"))
    parser.add_argument("--report-only", action="store_true",
                        help="measure nothing: rewrite the page from bench/results/latest.json")
    args = parser.parse_args()
    if args.report_only:
        return report_only(args.out)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in only if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {unknown}; choose from {', '.join(SECTIONS)}")

    plan = Plan(args.quick)
    os.makedirs(RESULTS, exist_ok=True)
    started = time.time()
    info = machine()
    notes: list[str] = []
    data: dict[str, Any] = {}
    runners = {"roundtrip": section_roundtrip, "throughput": section_throughput, "payload": section_payload,
               "start": section_start, "ddp": section_ddp, "ssh": section_ssh}
    section_seconds = {}
    for name in SECTIONS:
        if name in only:
            t = time.time()
            data[name] = runners[name](plan, notes)
            section_seconds[name] = time.time() - t
            log(f"{name} done in {section_seconds[name]:.0f}s")

    figs = figures(data)
    tgts = [t for t in targets(figs, data) if t.section in data]
    profiles: list[tuple[Target, dict[str, Any]]] = []
    if not args.no_profile:
        ranked = sorted((t for t in tgts if not math.isnan(t.value)), key=lambda t: t.distance, reverse=True)
        worst = [t for t in ranked if not t.passed][: plan.pick(2, 1)] or ranked[:1]
        for t in worst:
            tp = time.time()
            profiles.append((t, profile(t, plan)))
            section_seconds[f"profile {t.key}"] = time.time() - tp

    info["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    elapsed = time.time() - started
    command = "python bench/run.py" + (" --quick" if args.quick else "") + (
        f" --only {args.only}" if set(only) != set(SECTIONS) else "") + (" --no-profile" if args.no_profile else "")
    meta = {"machine": info, "command": command, "elapsed_s": elapsed, "section_seconds": section_seconds,
            "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"), "quick": args.quick,
            "notes": notes, "ssh_provider": have("skyward.providers.ssh")}
    with open(os.path.join(RESULTS, "latest.json"), "w") as f:
        json.dump({"meta": meta, "data": data, "profiles": [(t.key, p) for t, p in profiles]}, f)

    from report import write_report

    write_report(args.out, meta, data, figs, tgts, profiles)
    log(f"wrote {os.path.relpath(args.out, os.getcwd())} in {elapsed:.0f}s")
    for t in tgts:
        log(f"  {'n/a ' if math.isnan(t.value) else 'PASS' if t.passed else 'MISS'}  {t.text}: {t.shown}")
    return 0


def report_only(out: str) -> int:
    """Rewrite the page from the last run's saved measurements and profiles (no measuring)."""
    from report import write_report

    with open(os.path.join(RESULTS, "latest.json")) as f:
        saved = json.load(f)
    data = saved["data"]
    figs = figures(data)
    tgts = [t for t in targets(figs, data) if t.section in data]
    by_key = {t.key: t for t in tgts}
    profiles = [(by_key[k], p) for k, p in saved["profiles"] if k in by_key]
    write_report(out, saved["meta"], data, figs, tgts, profiles)
    log(f"rewrote {os.path.relpath(out, os.getcwd())} from bench/results/latest.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
