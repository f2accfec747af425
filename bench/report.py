"""Turns one run's measurements into ``docs/benchmarks.md`` and the PNG plots beside it."""

from __future__ import annotations

import math
import os
import re
from typing import Any

from _common import percentile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
IMG_REL = "img/bench"  # relative to docs/
ANALYSIS = os.path.join(HERE, "analysis.md")


# -- formatting ------------------------------------------------------------------------------------


def num(x: float, unit: str = "") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    a = abs(x)
    if unit == "tasks/s":
        s = f"{x:,.0f}"
    elif a >= 100:
        s = f"{x:,.0f}"
    elif a >= 10:
        s = f"{x:.1f}"
    elif a >= 1:
        s = f"{x:.2f}"
    else:
        s = f"{x:.3f}"
    return s


def spread(fig: Any) -> str:
    if len(fig.reps) < 2:
        return "(n=1)"
    return f"{num(fig.p10, fig.unit)}–{num(fig.p90, fig.unit)}"


def ratio_text(fig: Any) -> str:
    if not fig.ratio_reps:
        return "–"
    r = fig.ratio
    if len(fig.ratio_reps) >= 2:
        lo, hi = percentile(fig.ratio_reps, 10), percentile(fig.ratio_reps, 90)
        return f"{_r(r)}× ({_r(lo)}–{_r(hi)})"
    return f"{_r(r)}×"


def _r(x: float) -> str:
    return f"{x:.3f}" if x < 0.1 else f"{x:.2f}" if x < 10 else f"{x:.1f}"


def table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def fig_rows(figs: dict[str, Any], keys: list[str], ref_label: str) -> list[list[str]]:
    rows = []
    for k in keys:
        f = figs.get(k)
        if f is None:
            continue
        rows.append([f.label, f"{num(f.median, f.unit)}", spread(f), ratio_text(f) if f.ref is not None else
                     ("1 (reference)" if f.label == ref_label else "–"), str(len(f.reps))])
    return rows


def load_note(section: dict[str, Any]) -> str:
    load = [x for x in section.get("load", []) if not math.isnan(x)]
    if not load:
        return ""
    return f"1-minute load average when its repetitions started: {min(load):.2f}–{max(load):.2f}."


# -- plots -----------------------------------------------------------------------------------------


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"figure.dpi": 110, "font.size": 9, "axes.grid": True, "grid.alpha": 0.3})
    return plt


def _bars(ax: Any, figs: list[Any], color: Any = None, log: bool = False) -> None:
    labels = [f.label for f in figs]
    meds = [f.median for f in figs]
    lo = [max(0.0, f.median - f.p10) for f in figs]
    hi = [max(0.0, f.p90 - f.median) for f in figs]
    ax.barh(labels, meds, xerr=[lo, hi], color=color, capsize=3)
    if log:
        ax.set_xscale("log")
    ax.invert_yaxis()
    for i, m in enumerate(meds):
        ax.text(m, i, f"  {num(m, figs[i].unit)}", va="center", fontsize=8)


def plot_all(img_dir: str, data: dict[str, Any], figs: dict[str, Any]) -> dict[str, str]:
    plt = _plt()
    os.makedirs(img_dir, exist_ok=True)
    made: dict[str, str] = {}
    sky_color, other = "#1f77b4", "#9aa5b1"

    def colors(fs: list[Any]) -> list[str]:
        return [sky_color if f.label == "Skyward" else "#2ca02c" if "floor" in f.label else other for f in fs]

    if "roundtrip" in data:
        order = ["floor", "floor_spin", "floor_server_hop", "floor_client_hop", "floor_both_hops", "skyward",
                 "skyward_nospin", "ppe", "ray", "dask"]
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
        fig.suptitle("No-op round trip, warm 1-worker pool")
        fs = [figs[f"rt50.{s}"] for s in order if f"rt50.{s}" in figs]
        _bars(axes[0], fs, colors(fs), log=True)
        axes[0].set_title("p50 (µs, log); bars: p10–p90 of repetitions")
        raw = data["roundtrip"]["raw"]
        for s in ["floor", "floor_spin", "floor_both_hops", "skyward", "skyward_nospin", "ppe", "ray", "dask"]:
            if raw.get(s):
                xs = sorted(x * 1e6 for run in raw[s] for x in run)
                ys = [(i + 1) / len(xs) for i in range(len(xs))]
                axes[1].plot(xs, ys, label=figs[f"rt50.{s}"].label, lw=1.4 if s == "skyward" else 1)
        axes[1].set_xscale("log")
        axes[1].set_xlabel("µs")
        axes[1].set_title("CDF of every call, all repetitions")
        axes[1].legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        fig.savefig(os.path.join(img_dir, "roundtrip.png"))
        plt.close(fig)
        made["roundtrip"] = "roundtrip.png"
    if "throughput" in data:
        fs = [figs[f"tp.{s}"] for s in ["floor", "skyward", "ppe", "ray", "dask"] if f"tp.{s}" in figs]
        if fs:
            fig, ax = plt.subplots(figsize=(8, 3))
            _bars(ax, fs, colors(fs), log=True)
            ax.axvline(20_000, color="#d62728", ls="--", lw=1)
            ax.text(20_000, len(fs) - 0.5, " target 20,000/s", color="#d62728", fontsize=8)
            ax.set_title("10,000 tiny tasks submitted together, 2 workers (tasks/s, log scale)")
            fig.tight_layout()
            fig.savefig(os.path.join(img_dir, "throughput.png"))
            plt.close(fig)
            made["throughput"] = "throughput.png"
    if "payload" in data:
        sizes = data["payload"]["params"]["sizes"]
        fig, ax = plt.subplots(figsize=(7, 3.4))
        for s, c in (("floor", "#2ca02c"), ("skyward", sky_color)):
            pts = [(size, figs[f"pl.{s}.{size}"]) for size in sizes if f"pl.{s}.{size}" in figs]
            if pts:
                ax.errorbar([p[0] for p in pts], [p[1].median for p in pts],
                            yerr=[[p[1].median - p[1].p10 for p in pts], [p[1].p90 - p[1].median for p in pts]],
                            marker="o", capsize=3, color=c, label=pts[0][1].label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [f"{s} MiB" for s in sizes])
        ax.set_ylabel("GB/s (array bytes ÷ round-trip time)")
        ax.set_title("numpy array argument returned as the result, 1-node Local pool")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(img_dir, "payload.png"))
        plt.close(fig)
        made["payload"] = "payload.png"
    if "start" in data:
        fs = [figs[f"st.{s}"] for s in ["floor", "ppe", "skyward", "dask", "ray"] if f"st.{s}" in figs]
        if fs:
            fig, ax = plt.subplots(figsize=(8, 3))
            _bars(ax, fs, colors(fs), log=True)
            ax.axvline(1.0, color="#d62728", ls="--", lw=1)
            ax.set_title("4 workers: start to first result (s, log scale)")
            fig.tight_layout()
            fig.savefig(os.path.join(img_dir, "start.png"))
            plt.close(fig)
            made["start"] = "start.png"
    if "ddp" in data and any(data["ddp"]["raw"].values()):
        fig, ax = plt.subplots(figsize=(7, 3))
        for i, s in enumerate(["torchrun", "skyward"]):
            runs = data["ddp"]["raw"].get(s, [])
            pts = [x for r in runs for x in r["steps_per_s"]]
            if pts:
                ax.scatter(pts, [i] * len(pts), alpha=0.6, color=sky_color if s == "skyward" else other)
                ax.plot([percentile(pts, 50)] * 2, [i - 0.3, i + 0.3], color="black")
        ax.set_yticks([0, 1], ["torchrun", "Skyward + sky.plugins.torch()"])
        ax.set_xlabel("steps/s (each dot: one timed window; line: median)")
        ax.set_title("DDP, 2 ranks, gloo, CPU: the same training loop")
        ax.set_ylim(-0.6, 1.6)
        fig.tight_layout()
        fig.savefig(os.path.join(img_dir, "ddp.png"))
        plt.close(fig)
        made["ddp"] = "ddp.png"
    return made


# -- the page --------------------------------------------------------------------------------------


def _analysis_for(key: str) -> str:
    """The hand-written analysis for a profiled target (bench/analysis.md, '## key' sections)."""
    if not os.path.exists(ANALYSIS):
        return ""
    text = open(ANALYSIS).read()
    parts = re.split(r"^## ", text, flags=re.M)
    for part in parts[1:]:
        head, _, body = part.partition("\n")
        if key in [k.strip() for k in head.split(",")]:
            return body.strip()
    return ""


def _profile_md(target: Any, prof: dict[str, Any]) -> str:
    out = [f"### {target.text}: {target.shown} (target missed by {target.distance:.2f}×)"
           if not target.passed else f"### {target.text}: {target.shown} (met; the closest to its limit)"]
    out.append(f"Profiled case: `{prof['case']}` with `{prof['params']}`; raw profiles in `{prof['dir']}/` "
               "(not committed).")
    analysis = _analysis_for(target.key)
    if analysis:
        out.append("#### Reading of the profile\n\n" + analysis)
    out.append("#### The measured profile (this run)")
    if "costs" in prof:
        rows = [[k, "–" if v is None or isinstance(v, str) else f"{v:.2f}"] for k, v in prof["costs"].items()
                if not k.endswith("(error)")]
        out.append("Cost model: each stage of one no-op round trip timed alone, in one thread, in memory "
                   "(µs per call, median of 5):\n\n" + table(["stage", "µs"], rows))
    if "strace" in prof:
        rows = [[proc, ", ".join(f"{sc} {n:.2f}" for sc, n in calls if n >= 0.01)]
                for proc, calls in prof["strace"].items()]
        out.append("System calls per task (strace -f -c; the floor makes one `write` and two `read`s per "
                   "side):\n\n" + table(["process", "calls per task"], rows))
    if "pyspy" in prof:
        ps = prof["pyspy"]
        flags = prof.get("pyspy_flags", "")
        out.append(f"py-spy {flags} at {ps.get('rate')} Hz over {ps.get('region_seconds') or 0:.1f} s. "
                   + ("With `--gil` a sample is taken only from the thread holding the GIL, so a thread's share "
                      "is the fraction of wall time it spent running Python. " if "gil" in flags else
                      "py-spy drops samples of threads it sees as idle (blocked reads are often counted). ")
                   + "py-spy pauses the process to sample, which slows the profiled run down.")
        for proc, p in ps["processes"].items():
            thr = ", ".join(f"{t} {share * 100:.0f} %" if share is not None else f"{t} {n}"
                            for t, n, share in p["threads"])
            out.append(f"**{proc}** — {p['samples']} samples; share of wall time by thread: {thr}.\n\n"
                       + table(["where samples end (self)", "share"],
                               [[f"`{fr}`", f"{sh * 100:.1f} %"] for fr, _, sh in p["self"][:10]]))
    if "cprofile" in prof:
        cp = prof["cprofile"]
        tasks = prof.get("cprofile_tasks") or 0
        per = (lambda s: f"{s / tasks * 1e6:.2f}") if tasks else (lambda s: f"{s:.3f}")
        unit = "µs per task" if tasks else "s"
        rows = [[f"`{r['fn']}`", f"{r['ncalls']:,}", per(r["tottime"]), per(r["cumtime"])]
                for r in cp["by_tottime"][:12]]
        out.append(f"cProfile of the client (its overhead inflates every call; read the proportions), "
                   f"top by own time, in {unit}:\n\n" + table(["function", "calls", "own", "cumulative"], rows))
    for launcher in ("skyward", "torchrun"):
        key = f"perf_{launcher}"
        if key in prof:
            p = prof[key]
            out.append(f"perf of rank 0 under **{launcher}** over the timed windows (every thread, native "
                       "frames), by thread and library:\n\n"
                       + table(["share", "thread / library"], [[f"{s:.1f} %", f"`{w}`"]
                                                               for s, w in p["by_thread_and_library"]])
                       + "\n\nby symbol:\n\n"
                       + table(["share", "library / symbol"], [[f"{s:.1f} %", f"`{w}`"] for s, w in p["by_symbol"]]))
    for k, v in prof.items():
        if k.endswith("_error"):
            out.append(f"*{k[:-6]} failed: {v}*")
    return "\n\n".join(out)


def write_report(path: str, meta: dict[str, Any], data: dict[str, Any], figs: dict[str, Any], tgts: list[Any],
                 profiles: list[tuple[Any, dict[str, Any]]]) -> None:
    docs_dir = os.path.dirname(os.path.abspath(path))
    img_dir = os.path.join(docs_dir, IMG_REL)
    made = plot_all(img_dir, data, figs)
    m = meta["machine"]
    v = m["versions"]
    L: list[str] = []
    add = L.append
    add("# Benchmarks")
    add(f"*Generated by `{meta['command']}` on {meta['date']} in {meta['elapsed_s'] / 60:.1f} minutes. "
        "Every number on this page comes from that one run; re-running the command rewrites the page.*")
    add("Skyward side by side with Ray, Dask distributed, `concurrent.futures.ProcessPoolExecutor` and the "
        "physical floor (the same bytes through a bare pipe), on one machine, in one run. Each system runs in a "
        "fresh process per repetition and the repetitions are interleaved (A B C, C B A, ...), so that every "
        "system sees the same moments of a machine that other work shares. A figure is the **median of its "
        "repetitions**, with the **p10–p90 of the repetitions** as its spread, and its **ratio** to the floor "
        "or peer is the median of the per-repetition ratios (each Skyward repetition against the reference "
        "measured next to it), with that ratio's own p10–p90.")
    add("## Summary")
    rows = []
    for t in tgts:
        verdict = "–" if math.isnan(t.value) else "**PASS**" if t.passed else "**MISS**"
        rows.append([t.text, t.shown, verdict])
    if not any(t.key == "ssh" for t in tgts):
        why = data.get("ssh", {}).get("unavailable") or "not run (`--only`)"
        rows.append(["over SSH, bulk transfer ≥ 50 % of OpenSSH's on the same link", f"pending: {why}", "–"])
    add(table(["target", "measured", ""], rows))
    add("## The machine")
    add(table(["", ""], [
        ["CPU", f"{m['cpu']} ({m['cores']} cores{', ' + m['hypervisor'] + ' guest' if m['hypervisor'] else ''})"],
        ["memory", f"{m['memory_gib']} GiB"],
        ["OS", m["os"]],
        ["Python", f"{m['python_impl']} {m['python']}"],
        ["versions", ", ".join(f"{k} {v[k]}" for k in ("skyward", "ray", "dask", "distributed", "torch", "numpy",
                                                        "cloudpickle"))],
        ["load average (1, 5, 15 min)", f"{m['loadavg_at_start']} at start, {m.get('loadavg_at_end')} at end"],
    ]))
    floor_blocks = data.get("roundtrip", {}).get("block_p50", {}).get("floor", [])
    moved = (f" In this run the floor's p50 over a block of calls ranged from {min(floor_blocks) * 1e6:.1f} to "
             f"{max(floor_blocks) * 1e6:.1f} µs (median {percentile(floor_blocks, 50) * 1e6:.1f})."
             if floor_blocks else "")
    add(f"**Noise.** This machine has {m['cores']} cores and was shared with other work during the run (see the "
        "load averages, per section below). Latencies of microseconds depend on whether the two processes of "
        "a round trip land on the same core (a direct switch) or on two cores (a wake-up across cores, several "
        "times dearer on a virtual machine)." + moved + " Read ratios, not absolute numbers, and the spreads "
        "next to them.")
    if meta["notes"]:
        add("Notes on this run:\n\n" + "\n".join(f"- {n}" for n in meta["notes"]))
    add("Reproduce:\n\n```bash\npip install -e \".[bench]\" numpy torch py-spy   # peers: matplotlib, ray, "
        "dask[distributed]\npython bench/run.py            # everything, ~10 minutes on 2 cores\n"
        "python bench/run.py --quick    # fewer repetitions, no 512 MiB case, ~3 minutes\n```\n\n"
        "Raw samples of the last run: `bench/results/latest.json` (not committed).")

    # 1
    if "roundtrip" in data:
        d = data["roundtrip"]
        p = d["params"]
        add("## 1. Round trip of a no-op task")
        add(f"One call at a time on a warm one-worker pool: `noop() >> pool` (Skyward, `ComputePool(nodes=1)`), "
            "`ray.get(f.remote())` (`ray.init(num_cpus=1)`), `client.submit(f, pure=False).result()` (Dask "
            "`LocalCluster(n_workers=1, threads_per_worker=1, processes=True)`) and `ex.submit(f).result()` "
            "(`ProcessPoolExecutor(1)`). The **floor** is two processes ping-ponging a small pickled tuple over "
            "a pair of `os.pipe()`s (a framed write, a read of header and body, pickle and unpickle on both "
            "sides), with blocking reads. The **floor, both ends polling** row is the same floor whose two "
            "ends first poll for up to 50 µs before they block, as Skyward's readers do by default "
            "(`SKYWARD_SPIN_US`); **Skyward, SKYWARD_SPIN_US=0** is Skyward with that turned off. The three "
            "**floor + ...** rows are the floor with the thread hand-offs Skyward's round trip used to have, "
            "added piece by piece (see *What bounds it*). Every ratio is to the raw (blocking) floor. "
            f"Floor, its variants, ProcessPoolExecutor and Skyward run in one process, warm at once, in "
            f"{p['blocks']} alternating blocks of {p['calls_per_block']} calls per repetition; Ray and Dask run in "
            f"their own processes ({p['peer_calls']} calls each) between them. {p['reps']} repetitions. "
            + load_note(d))
        order = ["floor", "floor_spin", "floor_server_hop", "floor_client_hop", "floor_both_hops", "skyward",
                 "skyward_nospin", "ppe", "ray", "dask"]
        for q, title in (("rt50", "p50"), ("rt99", "p99")):
            rows = fig_rows(figs, [f"{q}.{s}" for s in order], "raw pipe floor")
            add(f"**{title}** (µs):\n\n" + table(["system", f"{title} µs", "p10–p90", "× floor (p10–p90)", "reps"],
                                                 rows))
        sr = figs.get("rt50.skyward/ray")
        if sr is not None:
            add(f"Skyward ÷ Ray (p50): **{ratio_text(sr)}**; p99: **{ratio_text(figs['rt99.skyward/ray'])}**"
                if "rt99.skyward/ray" in figs else f"Skyward ÷ Ray (p50): **{ratio_text(sr)}**")
        bp = d.get("block_p50", {})
        if bp.get("floor") and bp.get("skyward"):
            fast = min(bp["floor"])
            sky_med = percentile(bp["skyward"], 50)
            add("The floor is bimodal on this machine: a block runs at ~9 µs when the scheduler keeps both of "
                "its processes on one CPU and at ~40–60 µs when it puts them on two (each message then wakes "
                f"the other, idle vCPU); its block p50s in this run ranged from {min(bp['floor']) * 1e6:.1f} to "
                f"{max(bp['floor']) * 1e6:.1f} µs. Against its fastest block ({fast * 1e6:.1f} µs), the "
                f"conservative reading, Skyward's median block ({sky_med * 1e6:.1f} µs) is "
                f"**{sky_med / fast:.2f}×** the floor.")
        pc = d.get("per_call", {})
        if pc:
            rows = []
            for s in order:
                if s in pc and pc[s]:
                    def med(k: str, s: str = s) -> float:
                        return percentile([x[k] for x in pc[s]], 50)
                    rows.append([figs[f"rt50.{s}"].label if f"rt50.{s}" in figs else s,
                                 f"{med('client_cpu_us'):.1f}", f"{med('client_switches'):.2f}",
                                 f"{med('server_cpu_us'):.1f}", f"{med('server_switches'):.2f}"])
            add("CPU time and context switches per round trip (all threads; client from `getrusage`, serving "
                "process from `/proc/PID/task/*/schedstat` and `status`; median of repetitions):\n\n"
                + table(["system", "client CPU µs", "client switches", "server CPU µs", "server switches"],
                        rows))
        pinned = d.get("pinned_block_p50") or {}
        if pinned:
            free = d.get("block_p50", {})
            rows = []
            for s in ("floor", "floor_both_hops", "skyward", "skyward_nospin"):
                if s in pinned and free.get(s):
                    rows.append([LABELS_RT.get(s, s), f"{percentile(free[s], 50) * 1e6:.1f}",
                                 f"{percentile(pinned[s], 50) * 1e6:.1f}"])
            add("Diagnostic, not a figure: one more repetition with the whole process tree pinned to one CPU "
                "(`taskset -c 0`), so that no thread hand-off has to wake the other CPU. Median of the "
                "per-block p50s, µs:\n\n" + table(["system", "free (all repetitions)", "pinned to CPU 0"], rows))
        if "roundtrip" in made:
            add(f"![round trip]({IMG_REL}/{made['roundtrip']})")

    # 2
    if "throughput" in data:
        d = data["throughput"]
        add("## 2. Throughput: 10,000 tiny tasks submitted together")
        add("Two workers; `sky.gather(*[f(i) for i in range(10000)]) >> pool` (Skyward, 2 nodes), a list of "
            "`f.remote(i)` and one `ray.get` (`num_cpus=2`), `client.gather(client.map(f, range(10000), "
            "pure=False))` (Dask, 2 workers × 1 thread), `list(ex.map(f, range(10000)))` "
            "(`ProcessPoolExecutor(2)`, `chunksize=1`: one message per task, like the others). `f` returns its "
            "argument; results are checked. The **floor** sends the same 10,000 pickled tuples round robin "
            "through pipes to two forked echo processes, a writer and a reader thread per pipe, buffered. "
            f"Floor, ProcessPoolExecutor and Skyward: 3 alternating batches per repetition in one process; Ray and "
            f"Dask: one batch per repetition in their own processes. {d['params']['reps']} repetitions. "
            + load_note(d))
        rows = fig_rows(figs, [f"tp.{s}" for s in ["floor", "skyward", "ppe", "ray", "dask"]], "raw pipe floor")
        add(table(["system", "tasks/s", "p10–p90", "× floor (p10–p90)", "reps"], rows))
        if "tp.skyward/ray" in figs:
            add(f"Skyward ÷ Ray: **{ratio_text(figs['tp.skyward/ray'])}**.")
        if "throughput" in made:
            add(f"![throughput]({IMG_REL}/{made['throughput']})")

    # 3
    if "payload" in data:
        d = data["payload"]
        sizes = d["params"]["sizes"]
        add("## 3. Payload: a numpy array in, the same array out")
        add("`echo(a) >> pool` on a one-worker Local pool, where `echo` returns its argument (a float64 array), "
            "against the **raw pipe floor**: the same bytes written through a pipe to a forked child, which reads "
            "them all into a buffer it allocated once and writes them back; the parent reads them into a buffer "
            "it allocated once. GB/s = array bytes ÷ round-trip time (both directions are in the time, for "
            "both). Trips per process, after one warm-up trip: "
            + ", ".join(f"{s} MiB: {d['params']['trips'][str(s)] if str(s) in d['params']['trips'] else d['params']['trips'][s]}"
                        for s in sizes)
            + "; one fresh process per "
            f"system, size and repetition, alternating; {d['params']['reps']} repetitions. " + load_note(d))
        rows = []
        for size in sizes:
            fl, sk = figs.get(f"pl.floor.{size}"), figs.get(f"pl.skyward.{size}")
            if fl is None or sk is None:
                continue
            rows.append([f"{size} MiB", f"{num(fl.median)} ({spread(fl)})", f"{num(sk.median)} ({spread(sk)})",
                         ratio_text(sk)])
        add(table(["size", "floor GB/s (p10–p90)", "Skyward GB/s (p10–p90)", "Skyward ÷ floor"], rows))
        mrows = []
        for size in sizes:
            fl, sk = figs.get(f"mem.floor.{size}"), figs.get(f"mem.skyward.{size}")
            if fl is None or sk is None:
                continue
            mrows.append([f"{size} MiB", f"{fl.median:.2f}×", f"{sk.median:.2f}× ({spread(sk)})"])
        add("**Client peak memory.** Each case runs in a fresh process; the figure is the process's RSS "
            "high-water mark (`getrusage(RUSAGE_SELF).ru_maxrss`, which covers every trip) minus its RSS just "
            "before the array was created (`/proc/self/statm`, after the pool was up), divided by the array's "
            "size. The array itself (1×) and the result that comes back (1×) are inherent, so 2× is the "
            "least any echo can hold at its peak; the floor also holds exactly those two buffers.\n\n"
            + table(["size", "floor (× payload)", "Skyward (× payload, p10–p90)"], mrows))
        add("Over SSH against OpenSSH: see [section 6](#6-over-ssh-test-hosts).")
        if "payload" in made:
            add(f"![payload]({IMG_REL}/{made['payload']})")

    # 4
    if "start" in data:
        d = data["start"]
        add("## 4. Pool start: 4 workers to the first result")
        add("From the first line of pool creation to the first task's result, in a fresh process (the "
            "`import` of each library is done before the clock starts): `with ComputePool(nodes=4)` + "
            "`noop() >> pool` (Skyward), `ray.init(num_cpus=4)` + `ray.get(f.remote())`, Dask "
            "`LocalCluster(n_workers=4, threads_per_worker=1)` + `Client` + `submit(...).result()`, "
            "`ProcessPoolExecutor(4)` + `submit(...).result()` (fork, so no interpreter start). The **floor** is "
            "4 bare interpreters (`python -c pass`) started in parallel and waited for: the least any pool of "
            f"fresh Python processes pays. {d['params']['reps']} repetitions, alternating. " + load_note(d))
        rows = fig_rows(figs, [f"st.{s}" for s in ["floor", "ppe", "skyward", "dask", "ray"]], "raw pipe floor")
        add(table(["system", "s", "p10–p90", "× floor (p10–p90)", "reps"], rows))
        srows = fig_rows(figs, [f"stop.{s}" for s in ["ppe", "skyward", "dask", "ray"]], "")
        add("Shutdown afterwards (leaving the `with` block / `shutdown()` / `close()`), s:\n\n"
            + table(["system", "s", "p10–p90", "", "reps"], srows))
        if "st.skyward/ray" in figs:
            add(f"Skyward ÷ Ray: **{ratio_text(figs['st.skyward/ray'])}**.")
        add("An SSH pool of 2 test hosts, cold and warm: see [section 6](#6-over-ssh-test-hosts).")
        if "start" in made:
            add(f"![pool start]({IMG_REL}/{made['start']})")

    # 5
    if "ddp" in data:
        d = data["ddp"]
        p = d["params"]
        add("## 5. Distributed training tax")
        add("The same training function (`bench/ddp_script.py: train`, a 256→512→512→10 MLP, batch 64, SGD, "
            "`DistributedDataParallel`, gloo, CPU) on 2 ranks on this machine, launched by `torchrun "
            "--nnodes=1 --nproc_per_node=2` and by Skyward (`ComputePool(nodes=2, "
            "plugins=[sky.plugins.torch(backend=\"gloo\")])`, `train(...) @ pool`). Each launch runs "
            f"{p.get('warmup')} warm-up steps, then {p.get('windows')} timed windows of {p.get('steps')} steps "
            f"(barrier-to-barrier, rank 0); a repetition's figure is its median window. {p.get('reps')} "
            "repetitions per launcher, alternating. Nothing in the script sets thread counts: each launcher's "
            "environment applies. " + load_note(d))
        rows = fig_rows(figs, ["ddp.torchrun", "ddp.skyward"], "torchrun")
        add(table(["launcher", "steps/s", "p10–p90", "× torchrun (p10–p90)", "reps"], rows))
        wrows = fig_rows(figs, ["ddpwall.torchrun", "ddpwall.skyward"], "torchrun")
        add("Wall time of a whole launch (start, rendezvous, warm-up, the timed windows, shutdown), s:\n\n"
            + table(["launcher", "s", "p10–p90", "× torchrun", "reps"], wrows))
        trows = []
        for s in ("torchrun", "skyward"):
            runs = d["raw"].get(s, [])
            if runs:
                r0 = runs[0]
                threads = r0.get("cpu_ms_per_step_by_thread", {})
                trows.append([LAUNCHER_LABEL.get(s, s), str(r0.get("torch_threads")), str(r0.get("omp_num_threads")),
                              f"{r0.get('cpu_utilization', math.nan):.2f}",
                              ", ".join(f"{k} {v:.2f}" for k, v in list(threads.items())[:4])])
        if trows:
            add("What each rank-0 process ran with (first repetition): torch's intra-op threads, "
                "`OMP_NUM_THREADS`, CPUs kept busy during the timed windows, and CPU ms per step by thread "
                "name:\n\n" + table(["launcher", "torch threads", "OMP_NUM_THREADS", "CPUs busy",
                                     "CPU ms/step by thread"], trows))
        add("Over 2 SSH test hosts: not measured by this suite yet (Local only).")
        if "ddp" in made:
            add(f"![ddp]({IMG_REL}/{made['ddp']})")

    # 6
    add("## 6. Over SSH (test hosts)")
    add(ssh_start_md(data, figs))
    add(ssh_payload_md(data, figs))

    # what bounds it
    add("## What bounds it")
    if profiles:
        add("The figures furthest from their targets in this run, profiled right after the measurements "
            "(`bench/run.py` picks them by how far each misses: measured ÷ limit, or limit ÷ measured). The "
            "*reading* of each profile was written by a person from a run like this one and is kept in "
            "`bench/analysis.md`; the tables under it are regenerated every run.")
        for t, prof in profiles:
            add(_profile_md(t, prof))
    else:
        add("Not profiled in this run (`--no-profile`).")
    shown = {_analysis_for(t.key) for t, _ in profiles}
    for t in tgts:
        reading = _analysis_for(t.key)
        if not reading or reading in shown:
            continue
        same = [x for x in tgts if _analysis_for(x.key) == reading]
        heads = "; ".join(f"{x.text}: {x.shown} ({'–' if math.isnan(x.value) else 'PASS' if x.passed else 'MISS'})"
                          for x in same)
        add(f"### {heads}\n\nNot profiled in this run.\n\n{reading}")
        shown.add(reading)
    rest = _analysis_for("general")
    if rest:
        add("### Other observations\n\n" + rest)

    add("## Method notes")
    add("- Each system runs in a fresh interpreter per repetition (`bench/cases.py NAME PARAMS`), so one "
        "system's background threads or memory high-water mark never touch another's numbers; systems that "
        "need no daemons share one process per repetition and alternate block by block.\n"
        "- Percentiles use linear interpolation. With 3–5 repetitions p10–p90 is close to the min–max.\n"
        "- A ratio is the median of per-repetition ratios; the reference is measured in the same repetition "
        "(the same process for the floor, the neighbouring process for Ray and Dask).\n"
        "- Skyward pools run with `console=False`; Ray with `include_dashboard=False`; Dask with "
        "`dashboard_address=None`.\n"
        "- Section seconds in this run: " + ", ".join(f"{k} {v:.0f}" for k, v in meta["section_seconds"].items())
        + ".")
    text = "\n\n".join(L) + "\n"
    with open(path, "w") as f:
        f.write(text)


LABELS_RT = {"floor": "raw pipe floor", "floor_both_hops": "floor + both (Skyward's old thread structure)",
             "skyward": "Skyward", "skyward_nospin": "Skyward, SKYWARD_SPIN_US=0"}
LAUNCHER_LABEL = {"torchrun": "torchrun", "skyward": "Skyward + sky.plugins.torch()"}


def _ssh_why(data: dict[str, Any]) -> str | None:
    d = data.get("ssh")
    if d is None:
        return "not run (`--only`)"
    return d.get("unavailable")


def ssh_payload_md(data: dict[str, Any], figs: dict[str, Any]) -> str:
    head = "### Over SSH: one-way bulk transfer to a test host, against OpenSSH\n\n"
    why = _ssh_why(data)
    if why:
        return head + f"**Pending**: {why}."
    d = data["ssh"]
    rows = []
    for size in d["params"]["sizes"]:
        sk, os_ = figs.get(f"ssh.skyward.{size}"), figs.get(f"ssh.openssh.{size}")
        if sk is None or os_ is None:
            continue
        rows.append([f"{size} MiB", f"{num(os_.median)} ({spread(os_)})", f"{num(sk.median)} ({spread(sk)})",
                     ratio_text(sk)])
    return head + ("An SSH test host (a real `sshd` in its own network namespace on this machine, reached over a "
                   "veth pair and a bridge; see `tests/hosts/testhosts.py`). Skyward: `nbytes(a) >> pool` on a warm "
                   "one-host `sky.SSH` pool (paramiko; the array goes out, an int comes back). OpenSSH: "
                   "`ssh host 'cat > /dev/null'` fed the same bytes over a multiplexed connection opened "
                   "beforehand (`ControlMaster`), so neither pays for connecting; each picks its own cipher. "
                   f"{d['params'].get('sizes')} MiB, trips alternating, the ratio paired trip by trip. At small "
                   "sizes the OpenSSH figure is mostly the cost of opening a session and starting `cat` for "
                   "each transfer (Skyward's worker is already running), so read the largest size. "
                   + load_note(d) + "\n\n"
                   + table(["size", "OpenSSH GB/s (p10–p90)", "Skyward GB/s (p10–p90)", "Skyward ÷ OpenSSH"], rows))


def ssh_start_md(data: dict[str, Any], figs: dict[str, Any]) -> str:
    head = "### Over SSH: a pool of 2 test hosts, cold and warm\n\n"
    why = _ssh_why(data)
    if why:
        return head + f"**Pending**: {why}."
    rows = fig_rows(figs, ["sst.cold", "sst.new_image", "sst.warm"], "")
    return head + ("`ComputePool(provider=sky.SSH([...2 test hosts...], find_links=[wheelhouse], no_index=True, "
                   "system_site_packages=[\"numpy\"]), nodes=2)` + `noop() >> pool`, from creating the pool to the "
                   "first result. **Cold**: fresh hosts (skyward's directory `~/.skyward` and uv's cache wiped "
                   "first) and an image never seen: the client's wheel is uploaded and each host builds a uv venv "
                   "from a local wheelhouse (the hosts have no internet). **New image**: hosts used before "
                   "(wheel, uv and its cache there) but an image they have not built. **Warm**: an image the "
                   "hosts have built; the environment is reused. All include connecting and authenticating "
                   "(paramiko) and starting the workers. Run in that order (wiping makes interleaving "
                   "impossible).\n\n" + table(["pool", "s", "p10–p90", "", "reps"], rows))
