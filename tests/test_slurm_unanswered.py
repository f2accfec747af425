"""sky.Slurm when Slurm's controller does not answer (tests/slurm_cluster.py's real cluster, its
slurmctld paused with SIGSTOP: every Slurm command times out): a job the provider could not
confirm gone is never reported gone; the error names it and the ``scancel`` to run."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

import skyward as sky
from skyward.providers.base import PoolSpec
from tests import slurm_cluster

pytestmark = slurm_cluster.needs_slurm
slurm, nothing_left = slurm_cluster.slurm, slurm_cluster.nothing_left  # (the shared fixtures)


@contextlib.contextmanager
def controller_resumed(slurm) -> Iterator[subprocess.Popen]:
    """slurmctld's process, continued (SIGCONT) when the block ends whatever paused it."""
    controller = next(p for p in slurm.daemons if p.args[0] == "slurmctld")
    try:
        yield controller
    finally:
        controller.send_signal(signal.SIGCONT)


def test_a_pool_ending_while_slurm_does_not_answer_names_the_job_left_and_its_scancel(slurm) -> None:
    provider = sky.Slurm()
    provider.cancel_wait = 3.0  # (how long the release asks before it gives up)
    with controller_resumed(slurm) as controller, pytest.raises(sky.SkywardError) as caught:
        with sky.ComputePool(provider=provider, nodes=1, console=False) as pool:
            job = next(line.split()[0] for line in slurm.jobs() if line.split()[1] == f"skyward-{pool.id}")
            controller.send_signal(signal.SIGSTOP)  # (the pool ends while Slurm does not answer)
    said = str(caught.value)
    assert "teardown incomplete" in said and f"job {job} not confirmed gone" in said, said
    assert f"`scancel {job}`" in said and f"`squeue --jobs={job}`" in said, said
    # the command the error names ends the job, now that Slurm answers (nothing_left checks it)
    assert slurm.run("scancel", job).returncode == 0


def test_cancel_while_slurm_does_not_answer_raises_then_confirms_once_it_answers(slurm) -> None:
    granted = slurm.run("salloc", "--no-shell", "--nodes=1", "--job-name=skyward-unanswered")
    assert granted.returncode == 0, granted.stderr
    job = next(line.split()[0] for line in slurm.jobs() if line.split()[1] == "skyward-unanswered")
    provider = sky.Slurm()
    with controller_resumed(slurm) as controller, pytest.raises(sky.ProvisionError) as caught:
        controller.send_signal(signal.SIGSTOP)
        provider.cancel(job, timeout=2.0)
    assert f"job {job} not confirmed gone" in str(caught.value) and f"`scancel {job}`" in str(caught.value)
    provider.cancel(job)  # (Slurm answers: cancelled and confirmed gone)
    assert job not in {line.split()[0] for line in slurm.jobs()}


def test_a_failed_allocations_cleanup_while_slurm_does_not_answer_names_the_pools_jobs(slurm) -> None:
    # What a Ctrl-C or a failed start runs: cancel any job of the pool's name. Slurm does not
    # answer: the error says which jobs may be left and the scancel that ends them.
    granted = slurm.run("salloc", "--no-shell", "--nodes=1", "--job-name=skyward-stray")
    assert granted.returncode == 0, granted.stderr
    provider = sky.Slurm()
    provider.cancel_wait = 2.0
    with controller_resumed(slurm) as controller, pytest.raises(sky.ProvisionError) as caught:
        controller.send_signal(signal.SIGSTOP)
        provider.let_go(PoolSpec("stray", 1))
    said = str(caught.value)
    assert "jobs named skyward-stray not confirmed gone" in said, said
    assert "`scancel --me --name=skyward-stray`" in said and "`squeue --me --name=skyward-stray`" in said, said
    assert slurm.run("scancel", "--me", "--name=skyward-stray").returncode == 0  # (nothing_left checks it)


#: squeue as Slurm ships it, each call's arguments written to a log first.
LOGGED_SQUEUE = """#!/bin/sh
echo "$@" >> {log}
exec {squeue} "$@"
"""


def test_a_request_killed_unanswered_has_its_late_job_found_by_name_and_cancelled(slurm, tmp_path,
                                                                                   monkeypatch) -> None:
    # Every node busy, so the pool's request is sbatch's; the controller holds it (job_submit's
    # gate) past the request's timeout, the sbatch is killed, and Slurm makes the job only after
    # the provider has looked for the pool's jobs by name once.
    blocker = slurm.run("salloc", "--no-shell", "--exclusive", f"--nodes={len(slurm.nodes)}", "--job-name=blocker")
    assert blocker.returncode == 0, blocker.stderr
    bin_dir, log = tmp_path / "bin", tmp_path / "squeue.log"
    bin_dir.mkdir()
    log.touch()
    (bin_dir / "squeue").write_text(LOGGED_SQUEUE.format(log=log, squeue=shutil.which("squeue")))
    (bin_dir / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    provider = sky.Slurm()
    provider.request_timeout, provider.cancel_wait = 2.0, 15.0
    try:
        with slurm.gate("batch") as gate:
            def release_once_looked() -> None:
                gate.wait_held()
                while "--name=skyward-" not in log.read_text():  # (the request killed, its jobs looked for)
                    time.sleep(0.02)
                gate.release()

            releaser = threading.Thread(target=release_once_looked)
            releaser.start()
            with pytest.raises(sky.ProvisionError, match="did not answer within 2s"):
                with sky.ComputePool(provider=provider, nodes=2, console=False, start_timeout=60):
                    pass
            releaser.join()
        assert gate.released
    finally:
        slurm.run("scancel", "--name=blocker")
    assert slurm.wait_jobs_gone() == []  # the late job cancelled (it would run once the blocker is gone)
