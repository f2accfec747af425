"""Turns one run's figures into ``docs/benchmarks.md`` and the PNG plots beside it."""

from __future__ import annotations

import math
import os
from typing import Any

from _common import by_system, percentile

IMG_REL = "img/bench"  # relative to the page's directory


# -- formatting -------------------------------------------------------------------------------------


def num(x: float, unit: str = "") -> str:
    if x is None or math.isnan(x):
        return "–"
    a = abs(x)
    return (f"{x:,.0f}" if unit == "tasks/s" or a >= 100 else f"{x:.1f}" if a >= 10 else f"{x:.2f}" if a >= 1
            else f"{x:.3f}")


def _r(x: float) -> str:
    return f"{x:.3f}" if x < 0.1 else f"{x:.2f}" if x < 10 else f"{x:.1f}"


def spread(f: Any) -> str:
    return f"{num(f.q(10), f.unit)}–{num(f.q(90), f.unit)}" if len(f.reps) > 1 else "n=1"


def ratio_text(f: Any) -> str:
    if not f.ratio_reps:
        return "–"
    if len(f.ratio_reps) == 1:
        return f"{_r(f.ratio)}×"
    return f"{_r(f.ratio)}× ({_r(percentile(f.ratio_reps, 10))}–{_r(percentile(f.ratio_reps, 90))})"


def table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    return "\n".join(out + ["| " + " | ".join(r) + " |" for r in rows])


def fig_table(figs: dict[str, Any], keys: list[str], unit: str, ref: str, reps: str = "reps") -> str:
    """System | median | p10–p90 | ratio to the reference (p10–p90) | repetitions."""
    rows = [[f.label, num(f.median, f.unit), spread(f), ratio_text(f) if f.ref else "1 (reference)"
             if ref else "–", str(len(f.reps))] for f in (figs[k] for k in keys if k in figs)]
    return table(["system", unit, "p10–p90", f"× {ref} (p10–p90)" if ref else "", reps], rows)


def load_note(section: dict[str, Any]) -> str:
    load = [x for x in section.get("load", []) if not math.isnan(x)]
    return f"1-minute load average when its repetitions started: {min(load):.2f}–{max(load):.2f}." if load else ""


# -- plots ------------------------------------------------------------------------------------------


def plot_all(img_dir: str, figs: dict[str, Any]) -> dict[str, str]:
    """Bar charts (median, p10–p90 whiskers) per section; none without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}
    plt.rcParams.update({"figure.dpi": 110, "font.size": 9, "axes.grid": True, "grid.alpha": 0.3})
    os.makedirs(img_dir, exist_ok=True)
    charts = {  # name: (title, keys, log scale, target line)
        "roundtrip": ("No-op round trip, warm 1-worker pool: p50 µs (log)",
                      [f"rt50.{s}" for s in ("floor", "skyward", "ppe", "ray", "dask")], True, None),
        "throughput": ("Tiny tasks submitted together, 2 workers: tasks/s (log)",
                       [f"tp.{s}" for s in ("floor", "skyward", "ppe", "ray", "dask")], True, 20_000),
        "start": ("4 workers: start to first result, s (log)",
                  [f"st.{s}" for s in ("floor", "ppe", "skyward", "dask", "ray")], True, 1.0),
        "ddp": ("DDP, 2 ranks, gloo, CPU: steps/s", ["ddp.torchrun", "ddp.skyward"], False, None),
        "ssh": ("Over SSH: no-op round trip p50 µs", ["sshrt.cat", "sshrt.skyward"], False, None),
    }
    made = {}
    for name, (title, keys, log, line) in charts.items():
        fs = [figs[k] for k in keys if k in figs]
        if not fs:
            continue
        fig, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * len(fs)))
        meds = [f.median for f in fs]
        ax.barh([f.label.strip("`") for f in fs], meds, capsize=3,
                xerr=[[max(0.0, m - f.q(10)) for m, f in zip(meds, fs)], [max(0.0, f.q(90) - m) for m, f in
                                                                          zip(meds, fs)]],
                color=["#1f77b4" if f.label == "Skyward" else "#9aa5b1" for f in fs])
        for i, (m, f) in enumerate(zip(meds, fs)):
            ax.text(m, i, f"  {num(m, f.unit)}", va="center", fontsize=8)
        if line is not None:
            ax.axvline(line, color="#d62728", ls="--", lw=1)
        ax.set_xscale("log" if log else "linear")
        ax.invert_yaxis()
        ax.set_title(title)
        fig.tight_layout()
        fig.savefig(os.path.join(img_dir, f"{name}.png"))
        plt.close(fig)
        made[name] = f"{name}.png"
    return made


# -- the page ---------------------------------------------------------------------------------------

METHOD_NOTES = """\
- Each case runs in a fresh interpreter per repetition (`bench/cases.py NAME PARAMS`), so one system's \
background threads or memory high-water mark never touch another's numbers; systems that need no daemons \
share one process per repetition and alternate block by block.
- Skyward is driven only through its public API (`sky.compute`, `sky.ComputePool`, `sky.SSH`, `sky.Image`, \
`sky.gather`, `on_event`); every baseline is self-contained code in `bench/cases.py`.
- Percentiles use linear interpolation; with 3–5 repetitions p10–p90 is close to the min–max. A ratio is \
the median of per-repetition ratios, each against the reference measured in the same repetition (the same \
process for the floors, the neighbouring process for Ray and Dask).
- Skyward pools run with `console=False`; Ray with `include_dashboard=False`; Dask with \
`dashboard_address=None`.
- **The floor is bimodal on a small VM.** A block of floor round trips runs at ~8 µs when the scheduler \
keeps both processes on one CPU and at ~40–60 µs when it puts them on two (each message then wakes the \
other, idle vCPU), and which mode a block gets changes from run to run with nothing else running. Skyward \
has the same two placements. A ratio against the floor's median would flatter Skyward whenever the floor \
drew the slow mode, so the round-trip target is judged against the floor's *fastest* block whenever that \
is stricter.
- **Threads under DDP.** torchrun sets `OMP_NUM_THREADS=1` when it starts more than one rank per host; \
`sky.plugins.torch()` does the same for ranks that share a host (without it, two ranks' spinning OpenMP \
threads fought over 2 CPUs and Skyward ran at 0.06× torchrun). With it, full runs on a 2-vCPU VM have read \
0.90–1.07× torchrun: the 0.98× target sits inside that machine's run-to-run noise, so read several runs.
- **Payload.** An echo has to hold the array and the result that comes back, so 2× the payload is the \
least client peak memory there is; the floor holds exactly those two buffers. What separates Skyward from \
the floor in GB/s is fresh memory: the floor reuses one buffer per side, a task needs a new one per trip \
on each side.
"""


def write_report(path: str, meta: dict[str, Any], data: dict[str, Any], figs: dict[str, Any],
                 tgts: list[Any]) -> None:
    made = plot_all(os.path.join(os.path.dirname(os.path.abspath(path)), IMG_REL), figs)
    m = meta["machine"]
    L: list[str] = []
    add = L.append

    def img(name: str) -> None:
        if name in made:
            add(f"![{name}]({IMG_REL}/{made[name]})")

    add("# Benchmarks")
    add(f"*Generated by `{meta['command']}` on {meta['date']} in {meta['elapsed_s'] / 60:.1f} minutes. Every "
        "number on this page comes from that one run; re-running the command rewrites the page.*")
    if meta.get("quick"):
        add("**This page comes from `--quick`, a smoke test (one repetition, tiny sizes): its figures are not "
            "measurements.**")
    add("Skyward side by side with Ray, Dask distributed, `concurrent.futures.ProcessPoolExecutor`, torchrun, "
        "OpenSSH and the physical floor (the same bytes through a bare pipe), on one machine, in one run. Every "
        "figure is reported as a **ratio to a baseline measured in the same run**, next to the load average. "
        "Each system runs in a fresh process per repetition and the repetitions are interleaved (A B C, C B A, "
        "...), so that every system sees the same moments of a machine that other work may share. A figure is "
        "the **median of its repetitions** with their **p10–p90** as its spread; its ratio is the median of the "
        "per-repetition ratios, with that ratio's own p10–p90.")
    add("## Summary")
    add(table(["target", "measured", ""], [[t.text, t.shown, t.verdict] for t in tgts]))
    add("## The machine")
    v = m["versions"]
    add(table(["", ""], [
        ["CPU", f"{m['cpu']} ({m['cores']} cores)"], ["memory", f"{m['memory_gib']} GiB"], ["OS", m["os"]],
        ["Python", m["python"]], ["versions", ", ".join(f"{k} {v[k]}" for k in v)],
        ["skyward measured", f"`{m.get('skyward_from')}`"],
        ["load average (1, 5, 15 min)", f"{m['loadavg_at_start']} at start, {m.get('loadavg_at_end')} at end"],
    ]))
    add("Latencies of microseconds depend on whether the two processes of a round trip share a core or wake "
        "each other across cores (see the method notes): read ratios, not absolute numbers, and the spreads "
        "next to them.")
    if meta["notes"]:
        add("Notes on this run:\n\n" + "\n".join(f"- {n}" for n in meta["notes"]))
    add("Reproduce:\n\n```bash\npip install -e \".[bench]\" numpy torch   # peers: matplotlib, ray, "
        "dask[distributed]\npython bench/run.py                 # everything, ~10 minutes on 2 cores\n"
        "python bench/run.py --quick         # smoke test: every case once, tiny sizes\n"
        "python bench/roundtrip_local.py     # the Local round trip against the pipe floor, quickly\n```\n\n"
        "Raw samples of the last run: `bench/results/latest.json` (not committed).")

    if "roundtrip" in data:
        d, p = data["roundtrip"], data["roundtrip"]["params"]
        add("## 1. Round trip of a no-op task")
        add("One call at a time on a warm one-worker pool: `noop() >> pool` (Skyward, `ComputePool(nodes=1)`), "
            "`ray.get(f.remote())` (`ray.init(num_cpus=1)`), `client.submit(f, pure=False).result()` (Dask "
            "`LocalCluster(n_workers=1, threads_per_worker=1)`) and `ex.submit(f).result()` "
            "(`ProcessPoolExecutor(1)`). The **floor** is two processes ping-ponging a small pickled tuple over "
            "a pair of `os.pipe()`s (a framed write, a blocking read of header and body, pickle and unpickle on "
            f"both sides). Floor, ProcessPoolExecutor and Skyward run in one process, warm at once, in "
            f"{p['blocks']} alternating blocks of {p['calls']} calls per repetition; Ray and Dask in their own "
            f"processes ({p['peer_calls']} calls each) between them. Repetitions: {p['reps']}. " + load_note(d))
        order = ["floor", "skyward", "ppe", "ray", "dask"]
        for q in (50, 99):
            add(f"**p{q}** (µs):\n\n" + fig_table(figs, [f"rt{q}.{s}" for s in order], f"p{q} µs", "floor"))
        if "rt50.skyward/ray" in figs:
            add(f"Skyward ÷ Ray (p50): **{ratio_text(figs['rt50.skyward/ray'])}**; p99: "
                f"**{ratio_text(figs['rt99.skyward/ray'])}**.")
        floor = [percentile(b, 50) * 1e6 for r in by_system(d, "blocks").get("floor", []) for b in r]
        if floor:
            add(f"The floor's p50 per block ranged from {min(floor):.1f} to {max(floor):.1f} µs in this run; the "
                "target is judged against its fastest block when that is stricter (see the method notes).")
        img("roundtrip")

    if "throughput" in data:
        d, p = data["throughput"], data["throughput"]["params"]
        n = p["n"]
        add("## 2. Throughput: tiny tasks submitted together")
        add(f"Two workers, {n:,} tasks: `sky.gather(*[f(i) for i in range(n)]) >> pool` (Skyward, 2 nodes), a "
            "list of `f.remote(i)` and one `ray.get` (`num_cpus=2`), `client.gather(client.map(f, range(n), "
            "pure=False))` (Dask, 2 workers × 1 thread), `list(ex.map(f, range(n)))` (`ProcessPoolExecutor(2)`, "
            "one message per task like the others). `f` returns its argument; results are checked. The **floor** "
            "sends the same pickled tuples round robin through pipes to two forked echo processes, a writer and a "
            f"reader thread per pipe, buffered. Floor, ProcessPoolExecutor and Skyward: {p['batches']} "
            "alternating batches per repetition in one process; Ray and Dask: one batch per repetition in their "
            f"own processes. Repetitions: {p['reps']}. " + load_note(d))
        add(fig_table(figs, [f"tp.{s}" for s in ("floor", "skyward", "ppe", "ray", "dask")], "tasks/s", "floor"))
        if "tp.skyward/ray" in figs:
            add(f"Skyward ÷ Ray: **{ratio_text(figs['tp.skyward/ray'])}**.")
        img("throughput")

    if "payload" in data:
        d, p = data["payload"], data["payload"]["params"]
        add("## 3. Payload: a numpy array in, the same array out")
        add("`echo(a) >> pool` on a one-worker Local pool, where `echo` returns its argument (a float64 array), "
            "against the **raw pipe floor**: the same bytes written through a pipe (as large as the system lets "
            "a process make it) to a forked child, which reads them all into a buffer it allocated once and "
            "writes them back; the parent reads them into a buffer it allocated once. GB/s = array bytes ÷ "
            "round-trip time. Trips per process after one warm-up trip: "
            + ", ".join(f"{s} MiB: {p['trips'][str(s)]}" for s in p["sizes"])
            + f"; a fresh process per system, size and repetition, alternating; repetitions: {p['reps']}. "
            + load_note(d))
        rows, mrows = [], []
        for s in p["sizes"]:
            fl, sk = figs.get(f"pl.floor.{s}"), figs.get(f"pl.skyward.{s}")
            if fl and sk:
                rows.append([f"{s} MiB", f"{num(fl.median)} ({spread(fl)})", f"{num(sk.median)} ({spread(sk)})",
                             ratio_text(sk)])
                fm, sm = figs[f"mem.floor.{s}"], figs[f"mem.skyward.{s}"]
                mrows.append([f"{s} MiB", f"{fm.median:.2f}×", f"{sm.median:.2f}× ({spread(sm)})"])
        add(table(["size", "floor GB/s (p10–p90)", "Skyward GB/s (p10–p90)", "Skyward ÷ floor"], rows))
        add("**Client peak memory**: the process's RSS high-water mark (`getrusage`, covering every trip) minus "
            "its RSS just before the array was created (after the pool was up), over the array's size. 2× "
            "(the array and the result) is the least an echo can hold.\n\n"
            + table(["size", "floor (× payload)", "Skyward (× payload, p10–p90)"], mrows))

    if "start" in data:
        d = data["start"]
        add("## 4. Pool start: 4 workers to the first result")
        add("From the first line of pool creation to the first task's result, in a fresh process (each "
            "library imported before the clock starts): `ComputePool(nodes=4)` + `noop() >> pool` (Skyward), "
            "`ray.init(num_cpus=4)` + `ray.get(f.remote())`, Dask `LocalCluster(n_workers=4)` + `Client` + "
            "`submit(...).result()`, `ProcessPoolExecutor(4)` + `submit(...).result()` (fork: no interpreter "
            "start). The **floor** is 4 bare interpreters (`python -c pass`) started in parallel and waited for: "
            f"the least a pool of fresh Python processes pays. Repetitions: {d['params']['reps']}, alternating. "
            + load_note(d))
        add(fig_table(figs, [f"st.{s}" for s in ("floor", "ppe", "skyward", "dask", "ray")], "s", "floor"))
        add("Shutdown afterwards (leaving the `with` block / `shutdown()` / `close()`), s:\n\n"
            + fig_table(figs, [f"stop.{s}" for s in ("ppe", "skyward", "dask", "ray")], "s", ""))
        if "st.skyward/ray" in figs:
            add(f"Skyward ÷ Ray: **{ratio_text(figs['st.skyward/ray'])}**.")
        img("start")

    if "ddp" in data:
        d, p = data["ddp"], data["ddp"]["params"]
        add("## 5. Distributed training: Skyward against torchrun")
        add("The same training function (`bench/ddp_script.py: train`, a 256→512→512→10 MLP, batch 64, SGD, "
            "`DistributedDataParallel`, gloo, CPU) on 2 ranks on this machine, launched by `torchrun "
            "--nnodes=1 --nproc_per_node=2` and by Skyward (`ComputePool(nodes=2, plugins=[sky.plugins.torch("
            "backend=\"gloo\")])`, `train(...) @ pool`). Each launch runs "
            f"{p['warmup']} warm-up steps, then {p['windows']} timed windows of {p['steps']} steps (barrier to "
            f"barrier, rank 0); a repetition's figure is its median window. Repetitions per launcher: "
            f"{p['reps']}, alternating. Nothing in the script sets thread counts: each launcher's environment "
            "applies. " + load_note(d))
        add(fig_table(figs, ["ddp.torchrun", "ddp.skyward"], "steps/s", "torchrun"))
        add("Wall time of a whole launch (start, rendezvous, warm-up, timed windows, shutdown), s:\n\n"
            + fig_table(figs, ["ddpwall.torchrun", "ddpwall.skyward"], "s", "torchrun"))
        runs = by_system(d)
        names = {"torchrun": "torchrun", "skyward": "Skyward + sky.plugins.torch()"}
        rows = [[names[s], str(runs[s][0]["torch_threads"]), str(runs[s][0]["omp_num_threads"])]
                for s in names if runs.get(s)]
        if rows:
            add("What rank 0 ran with (first repetition): torch's intra-op threads and `OMP_NUM_THREADS` (see the "
                "method notes):\n\n" + table(["launcher", "torch threads", "OMP_NUM_THREADS"], rows))
        img("ddp")

    add("## 6. Over SSH (test hosts)")
    d = data.get("ssh")
    if d is None or "unavailable" in d:
        add(f"**Not measured**: {d['unavailable'] if d else 'not run (`--only`, or the section failed)'}.")
    else:
        add("Real `sshd`s, each in its own network namespace on this machine, reached over a veth pair and a "
            "bridge (`tests/hosts/testhosts.py`); they have no internet, so `sky.SSH([...], "
            "find_links=[wheelhouse], no_index=True, system_site_packages=[\"numpy\"])` installs from a local "
            "wheelhouse. OpenSSH runs over a master connection opened beforehand (`ControlMaster`), so neither "
            "side pays for connecting in 6.2 and 6.3. " + load_note(d))
        add("### 6.1 Pool of 2 hosts, cold and warm\n\n"
            "Creating the pool to the first result of `noop() >> pool`, connecting, authenticating and starting "
            "the workers included. **Cold**: fresh hosts (`~/.skyward` and uv's cache wiped) and an image never "
            "seen: the wheel is uploaded and each host builds a uv venv. **New image**: used hosts, an image they "
            "have not built. **Warm**: an image the hosts have built. Run in that order (wiping makes "
            "interleaving impossible).\n\n"
            + fig_table(figs, ["sst.cold", "sst.new_image", "sst.warm"], "s", ""))
        pr = d["params"]
        add("### 6.2 Round trip of a no-op task, against an `ssh host cat` echo\n\n"
            "`noop() >> pool` on a warm one-host pool, against one `ssh host cat` session kept open, to which "
            "each call writes the floor's small framed pickle and reads the same bytes back: what one message "
            "each way over that SSH link costs with no RPC layer. Both warm in one process, "
            f"{pr['rt_blocks']} alternating blocks of {pr['rt_calls']} calls; a row's figure is the median of "
            "its blocks' p50s, the ratio is paired block by block.\n\n"
            + fig_table(figs, ["sshrt.cat", "sshrt.skyward"], "p50 µs", "ssh cat", reps="blocks"))
        img("ssh")
        rows = []
        for s in pr["sizes"]:
            o, k = figs.get(f"ssh.openssh.{s}"), figs.get(f"ssh.skyward.{s}")
            if o and k:
                rows.append([f"{s} MiB", f"{num(o.median)} ({spread(o)})", f"{num(k.median)} ({spread(k)})",
                             ratio_text(k)])
        add("### 6.3 One-way bulk transfer, against OpenSSH\n\n"
            "`nbytes(a) >> pool` on a warm one-host pool (the array goes out, an int comes back) against "
            "`ssh host 'cat > /dev/null'` fed the same bytes; each picks its own cipher. Trips alternate, the "
            "ratio is paired trip by trip. At small sizes the OpenSSH figure is mostly opening a session and "
            "starting `cat` (Skyward's worker is already running): read the largest size.\n\n"
            + table(["size", "OpenSSH GB/s (p10–p90)", "Skyward GB/s (p10–p90)", "Skyward ÷ OpenSSH"], rows))

    add("## Method notes")
    add(METHOD_NOTES + "- Section seconds in this run: "
        + ", ".join(f"{k} {v:.0f}" for k, v in meta["section_seconds"].items()) + ".")
    with open(path, "w") as f:
        f.write("\n\n".join(L) + "\n")
