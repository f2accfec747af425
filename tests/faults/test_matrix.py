"""The fault matrix: every exit path of a user's program, on every provider, in every phase of
a pool's life, leaves no process of the pool on any host, and an error names the right node.

Each case runs :mod:`tests.faults.client` (a user's program) in a process of its own, waits
until every node has reached the phase, applies the exit path, then checks what the program
said and that nothing carrying the case's tag is left: no worker, no keeper, no process a
task started (a task of the ``running`` phase starts a daemon and a process in a session of
its own), no bootstrap or setup command. ``scripts/reliability.py`` runs this module and
writes the counts to docs/reliability.md.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.aws_conftest import aws, moto_server  # noqa: F401  (fixtures)
from tests.conftest import interactive_signals
from tests.hosts import testhosts

CLIENT = Path(__file__).with_name("client.py")
ROOT = Path(__file__).parents[2]
#: The pool's idle_timeout in the client (seconds), and how long the test then waits for
#: everything of the pool to be gone.
IDLE_TIMEOUT = 3.0
SETTLE = IDLE_TIMEOUT + 7
#: Node 1 silenced (its link cut, its worker stopped): the program must have named it and
#: ended within this many seconds: idle_timeout, then a few seconds each for noticing, the
#: other node's task to stop (a grace of 5 s at teardown) and the silent host's stop (3 s).
#: (Before silence was handled alike everywhere, every SSH case took about 21 s; now about 7 s.)
SILENT_ENDS_WITHIN = IDLE_TIMEOUT + 15


@dataclass(frozen=True)
class Case:
    provider: str  # "local" | "ssh"
    phase: str  # "preparing" | "starting" | "running" | "teardown"
    path: str  # how the program ends (see EXPECTED)

    @property
    def id(self) -> str:
        return f"{self.provider}-{self.phase}-{self.path}"

    @property
    def left_to_watchdog(self) -> bool:
        """The machines are left for their own watchdog to power off (see WATCHDOG)."""
        return self.provider == "aws" and self.path == "SIGKILL"


#: Node 1 goes silent mid-task (no end of stream, no exit code), while the program waits in a
#: broadcast, a gather or ``>>``: its host's link is cut (SSH, AWS) or its worker is stopped
#: with SIGSTOP (Local, which has no link to cut).
SILENT = {"ssh": ("link-cut", "link-cut-gather", "link-cut-run"),
          "local": ("stopped", "stopped-gather", "stopped-run")}
PATHS = {
    "preparing": ("SIGINT", "SIGKILL"),
    "starting": ("exception", "SIGINT", "SIGKILL", "worker-killed"),
    "running": ("return", "exception", "SIGINT", "SIGTERM", "SIGKILL", "worker-killed", *SILENT["ssh"],
                *SILENT["local"]),
    "teardown": ("return", "SIGKILL"),
    # elastic pools: a scale-up's node starting; a lost node's replacement running a broadcast
    "scaling": ("return", "exception", "SIGINT", "SIGKILL"),
    "replaced": ("return", "exception", "SIGINT", "SIGKILL"),
}
CASES = [Case(provider, phase, path)
         for provider in ("local", "ssh") for phase, paths in PATHS.items() for path in paths
         if (provider == "ssh" or phase != "preparing")
         and not any(path in silent for other, silent in SILENT.items() if other != provider)]
# AWS (moto's EC2, its instances the SSH test hosts): the SSH cases. A client killed outright
# cannot release the machines: their own watchdog does (it powers them off), which neither
# moto nor a test host can run, so there the test checks that the instances are still there
# and that `skyward down`, what the user is told to run, removes everything (see WATCHDOG).
# (A replacement on moto would need an address the two test hosts do not have.)
CASES += [Case("aws", case.phase, case.path) for case in CASES if case.provider == "ssh" and case.phase != "replaced"]

#: Why the AWS cases with the client killed outright stop short of the instances' end.
WATCHDOG = (
    "An instance's dead man's switch is a watchdog, a systemd service that cloud-init installs "
    "from the launch's user data: with no SSH connection for `idle_timeout` (60 s at the least) "
    "it runs `shutdown -h now`, and EC2 terminates an instance that powers itself off because "
    "the launch asked for `InstanceInitiatedShutdownBehavior=terminate`. None of that can run "
    "here: moto runs no user data and has no guest that could power off, and a test host has "
    "neither cloud-init nor systemd and must not power off (it is a network namespace of this "
    "machine). So these cases check the hosts as the others do (nothing of the pool is left: "
    "the workers and the host preparation stop by their own switch), then that the instances, "
    "key pair and security group are all still there, and that `skyward down --all`, the "
    "command the AWS page tells a user to run, removes them and confirms it. The watchdog "
    "script itself is run in `tests/test_aws.py`, with a `shutdown` that records its "
    "arguments: it powers off once an established connection to the SSH port closes, and at "
    "`max_lifetime`; the same file checks that the launch asks EC2 to terminate on power-off."
)

#: What the program's output must say (all of it), by exit path; None: nothing to say.
EXPECTED = {
    "return": ["closed"],
    "exception": {"starting": ["PluginError", "on node 1", "node 1 cannot start"],
                  "running": ["ValueError: node 1 fails", "(node 1)"],
                  "scaling": ["RuntimeError: the program fails while the pool scales up"],
                  "replaced": ["ValueError: node 1 fails", "(node 1)"]},
    "SIGINT": ["interrupted: pool"],  # the pool's one line, no traceback
    "SIGTERM": None,
    "SIGKILL": None,
    "worker-killed": ["WorkerLost: node 1", "killed by SIGKILL"],
    **{path: ["WorkerLost: node 1", "no heartbeat"] for paths in SILENT.values() for path in paths},
}


def tagged(tag: str) -> dict[int, str]:
    """Every process on this machine (the test hosts share its process ids) whose environment
    or command line carries ``tag``: pid -> command line."""
    needle = tag.encode()
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state != b"Z" and (needle in cmdline or needle in environ):
            found[int(entry)] = cmdline.replace(b"\0", b" ").decode(errors="replace")
    return found


def wait_for(predicate, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


def apply_exit_path(client: subprocess.Popen, path: str, pid_file: str, hosts) -> testhosts.TestHost | None:
    """Apply exit path ``path`` from outside to a client program that reached its phase (a
    signal to it; node 1's worker, whose pid ``pid_file`` holds, killed or stopped; node 1's
    host cut off); returns the host cut off, if any."""
    if path.startswith("SIG"):
        client.send_signal(signal.Signals[path])
    elif path == "worker-killed":
        os.kill(int(Path(pid_file).read_text()), signal.SIGKILL)
    elif path.startswith("stopped"):
        os.kill(int(Path(pid_file).read_text()), signal.SIGSTOP)
    elif path.startswith("link-cut"):
        hosts[1].set_link(False)
        return hosts[1]
    return None


def clean_up_case(client: subprocess.Popen, cut: testhosts.TestHost | None, tag: str) -> None:
    """Whatever the case's outcome: the program ended, the host's link back, the markers gone."""
    if client.poll() is None:
        client.kill()
        client.communicate()
    if cut is not None:
        cut.set_link(True)
    for f in Path("/tmp").glob(f"{tag}*"):
        f.unlink(missing_ok=True)


@pytest.fixture
def hosts(request):
    if request.node.callspec.params["case"].provider == "local":
        return None
    return request.getfixturevalue("test_hosts")[:2]


def aws_options(request, hosts, wheelhouse: str) -> dict:
    """An AWS provider's options whose instances land on ``hosts`` (see tests/test_aws_e2e.py);
    the ``aws`` fixture checks afterwards that no instance, key pair or security group is left."""
    import ipaddress

    from tests.test_aws_e2e import subnet_with_only

    cloud = request.getfixturevalue("aws")
    network = ipaddress.ip_interface(f"{hosts[0].bridge_ip}/24").network
    subnet = subnet_with_only(cloud, network, [h.ip for h in hosts])
    return {"subnet_id": subnet, "ami": cloud.ami, "user": hosts[0].user, "ssh_key": hosts[0].key_path,
            "known_hosts": hosts[0].known_hosts_all, "ssh_cidr": f"{hosts[0].bridge_ip}/32",
            "find_links": [wheelhouse], "no_index": True, "connect_timeout": 5, "boot_timeout": 60}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_every_exit_path_leaves_nothing_and_names_the_node(case: Case, hosts, request, tmp_path) -> None:
    tag = f"skyfault{uuid.uuid4().hex[:10]}"
    marker = f"/tmp/{tag}"
    cfg = {"provider": case.provider, "phase": case.phase, "path": case.path, "tag": tag, "marker": marker}
    env = dict(os.environ, SKYWARD_FAULT_TAG=tag, PYTHONPATH=str(ROOT))
    if case.provider == "aws":
        cfg["aws"] = aws_options(request, hosts, request.getfixturevalue("wheelhouse"))
        env = dict(os.environ, SKYWARD_FAULT_TAG=tag, PYTHONPATH=str(ROOT))  # (with the aws fixture's)
    elif hosts is not None:
        wheelhouse = request.getfixturevalue("wheelhouse")
        cfg["ssh"] = {"hosts": [h.ip for h in hosts], "user": hosts[0].user, "key": hosts[0].key_path,
                      "known_hosts": hosts[0].known_hosts_all, "wheelhouse": wheelhouse}
    client = subprocess.Popen([sys.executable, str(CLIENT), json.dumps(cfg)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path,
                              preexec_fn=interactive_signals)
    cut: testhosts.TestHost | None = None
    try:
        names = [h.name for h in hosts] if case.phase == "preparing" else [0, 1]
        reached = wait_for(lambda: client.poll() is not None
                           or all(Path(f"{marker}-{case.phase}-{n}").exists() for n in names), 90)
        self_applied = case.path in ("return", "exception")  # (the program may be over by now)
        assert reached and (self_applied or client.poll() is None), (
            f"the phase was never reached:\n{client.stdout.read() if client.poll() is not None else ''}")
        if case.path.startswith("SIG") and case.phase == "preparing":  # (and setup is running on the hosts)
            assert wait_for(lambda: len(tagged(tag)) >= 3, 10)
        cut = apply_exit_path(client, case.path, f"{marker}-{case.phase}-1", hosts)
        applied = time.monotonic()
        out, _ = client.communicate(timeout=60)
        ended_after = time.monotonic() - applied
    finally:
        clean_up_case(client, cut, tag)
    def left() -> dict:
        found = {"this machine": tagged(tag)}
        for h in hosts or ():  # (their own network namespaces: only this session's pools run there)
            found[h.name] = h.process_cmdlines("skyward")
        return {where: procs for where, procs in found.items() if procs}

    left_behind = {} if wait_for(lambda: not left(), SETTLE) else left()
    expected = EXPECTED[case.path]
    if isinstance(expected, dict):
        expected = expected[case.phase]
    missing = [text for text in expected or () if text not in out]
    assert not left_behind and not missing, (
        f"left behind: {left_behind}\nnot said: {missing}\nthe program's output:\n{out[-3000:]}")
    if any(case.path in silent for silent in SILENT.values()):
        assert ended_after < SILENT_ENDS_WITHIN, (
            f"the program ended {ended_after:.1f}s after node 1 went silent\nthe program's output:\n{out[-3000:]}")
    if case.left_to_watchdog:
        down_removes_what_the_watchdog_would(request.getfixturevalue("aws"))


def down_removes_what_the_watchdog_would(cloud) -> None:
    """A killed client's instances, key pair and security group are still there (the instances
    are the watchdog's to power off, see WATCHDOG); ``skyward down --all`` removes them all."""
    left = cloud.leftovers()
    assert len(left.get("instances", ())) == 2 and left.get("key_pairs") and left.get("security_groups"), left
    pools = [t["Value"] for k in cloud.client().describe_key_pairs(KeyNames=left["key_pairs"])["KeyPairs"]
             for t in k.get("Tags", ()) if t["Key"] == "skyward:pool"]
    scratch = [d for pool in pools for d in glob.glob(os.path.join(tempfile.gettempdir(), f"skyward-aws-{pool}-*"))]
    down = subprocess.run([sys.executable, "-m", "skyward.cli", "down", "--all", "--timeout", "60"],
                          capture_output=True, text=True, timeout=90, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert down.returncode == 0 and "removed and confirmed" in down.stdout, down.stdout + down.stderr
    # the killed client's private directory goes with its machines (it may hold their login key)
    assert pools and scratch and [d for d in scratch if os.path.exists(d)] == [], (pools, scratch)
    # (the aws fixture checks afterwards that nothing is left)
