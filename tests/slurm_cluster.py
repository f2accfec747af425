"""A real Slurm cluster for the tests, from Debian's packages (slurmctld, slurmd, munge).

The controller runs on this machine, listening on the test hosts' bridge address; each test
host (tests/hosts/testhosts.py) is one compute node: ``slurmd -N <host>`` entered into the
host's network and UTS namespaces with ``nsenter`` (its own address and hostname). Not
``ip netns exec``: that remounts ``/sys``, which hides the cgroup mounts, and slurmd refuses
to start. The mount namespace stays this machine's, so every node shares the filesystem with
the client, as compute nodes share ``$HOME`` with a login node.

Everything is private to one cluster: its ``slurm.conf`` (reached through ``SLURM_CONF``), a
munge daemon with its own key and socket (``AuthInfo=socket=...``), the ports (chosen free),
and the state, spool and log directories under ``base``. So two pytest-xdist workers (each
with its own slot of test hosts) run a cluster each, side by side.

A gate in the controller (:meth:`SlurmCluster.gate`, a ``job_submit/lua`` script) holds a
request of ours after it was sent and before Slurm created its job, for as long as a test wants:
the worst moment to interrupt the client that sent it.

Process tracking is ``proctrack/linuxproc`` and tasks are not confined (``task/none``): the
cgroup plugins need a cgroup hierarchy of their own per node, which namespaces sharing this
machine's ``/sys/fs/cgroup`` cannot give.
"""

from __future__ import annotations

import contextlib
import os
import select
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

PARTITION = "debug"
#: A second partition on the same nodes: a higher priority tier, whose jobs preempt (cancel)
#: the default partition's (PreemptType=preempt/partition_prio), and a MaxTime of 30 minutes.
URGENT = "urgent"
URGENT_MAX_TIME = "00:30:00"
CPUS_PER_NODE = 2
#: Each node's GPUs as Slurm counts them: stand-in device files (gres.conf), nothing runs on them;
#: the provider only reads how many a node has.
GPUS_PER_NODE = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return int(s.getsockname()[1])


@dataclass
class SlurmCluster:
    """A running cluster: its config, nodes and daemons (see the module docstring)."""

    base: Path
    conf: str
    nodes: list[str]
    addrs: dict[str, str]
    partition: str = PARTITION
    daemons: list[subprocess.Popen] = field(default_factory=list)
    #: Each node's slurmd command (entering its host's namespaces), and its running slurmd.
    slurmd_argv: dict[str, list[str]] = field(default_factory=dict)
    slurmds: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        """This process's environment, pointing Slurm's commands at this cluster."""
        return {**os.environ, "SLURM_CONF": self.conf}

    def run(self, *argv: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run a Slurm command against this cluster."""
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout)

    def jobs(self) -> list[str]:
        """Every job the controller still holds, as ``id name state`` lines."""
        out = self.run("squeue", "-h", "-o", "%i %j %T").stdout
        return [line for line in out.splitlines() if line.strip()]

    def wait_jobs_gone(self, timeout: float = 30.0) -> list[str]:
        """Wait until squeue lists no job; the jobs left after ``timeout``."""
        deadline = time.monotonic() + timeout
        while (left := self.jobs()) and time.monotonic() < deadline:
            time.sleep(0.2)
        return left

    def wait_idle(self, timeout: float = 60.0) -> None:
        """Wait until every node is idle (registered, nothing running)."""
        deadline = time.monotonic() + timeout
        while True:
            out = self.run("sinfo", "-h", "-N", "-o", "%N %t").stdout.split("\n")
            states = dict(line.split() for line in out if line.strip())
            if all(states.get(n) == "idle" for n in self.nodes):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"Slurm nodes not idle after {timeout:g}s: {states}\n{self.logs()}")
            time.sleep(0.2)

    def workers(self) -> list[int]:
        """PIDs of skyward workers of this cluster's job steps (on any node), and the ``srun``
        commands that started them."""
        return [pid for pid in _processes_with_env(f"SLURM_CONF={self.conf}")
                if b"skyward.worker" in _cmdline(pid)]

    def processes(self, *marks: bytes) -> list[int]:
        """PIDs of processes of this cluster's job steps whose command line has any of ``marks``."""
        return [pid for pid in _processes_with_env(f"SLURM_CONF={self.conf}")
                if any(mark in _cmdline(pid) for mark in marks)]

    def wait_workers_gone(self, timeout: float = 15.0) -> list[int]:
        deadline = time.monotonic() + timeout
        while (left := self.workers()) and time.monotonic() < deadline:
            time.sleep(0.1)
        return left

    def start_slurmd(self, node: str) -> None:
        """Start ``node``'s slurmd (again: it registers, and Slurm returns the node to service)."""
        log = open(self.base / "daemons.log", "ab")  # noqa: SIM115 - the daemon's own stdio
        proc = subprocess.Popen(self.slurmd_argv[node], stdout=log, stderr=log, env=self.env, start_new_session=True)
        self.slurmds[node] = proc
        self.daemons.append(proc)

    def kill_slurmd(self, node: str) -> None:
        """SIGKILL ``node``'s slurmd, as a crash would (its job steps' slurmstepd stay)."""
        proc = self.slurmds[node]
        proc.kill()
        proc.wait(10)

    @contextlib.contextmanager
    def gate(self, kind: str) -> Iterator[Gate]:
        """Hold the next request (``kind``: ``"batch"``, sbatch's, or ``"allocation"``, salloc's)
        for a job named ``skyward-*`` in the controller until :meth:`Gate.release`; released at
        the latest when the block ends."""
        held, gate, armed = self.base / "held", self.base / "gate", self.base / "armed"
        for fifo in (held, gate):
            with contextlib.suppress(FileNotFoundError):
                fifo.unlink()
            os.mkfifo(fifo)
        reader = os.open(held, os.O_RDONLY | os.O_NONBLOCK)  # (open first: the script's write does not wait)
        armed.write_text(kind + "\n")
        opened = Gate(reader, gate)
        try:
            yield opened
        finally:
            with contextlib.suppress(FileNotFoundError):
                armed.unlink()
            if not opened.name:  # (a request held that the test never waited for)
                with contextlib.suppress(BlockingIOError):
                    opened.name = os.read(reader, 200).decode().strip()
            if opened.name and not opened.released:
                opened.release()
            os.close(reader)

    def logs(self) -> str:
        parts = []
        for path in sorted(self.base.glob("*.log")):
            parts.append(f"--- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-15:]))
        return "\n".join(parts)

    def stop(self) -> None:
        """Cancel every job, then stop every daemon (slurmds, controller, munge)."""
        with contextlib.suppress(Exception):
            self.run("scancel", "--full", "--quiet", f"--partition={self.partition}", timeout=15)
            self.wait_jobs_gone(15)
        for proc in reversed(self.daemons):
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(self.daemons):
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        # slurmstepd processes a slurmd left (it does not wait for them): found by this
        # cluster's config path in their environment.
        for pid in _processes_with_env(f"SLURM_CONF={self.conf}"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@dataclass
class Gate:
    """A request held in the controller (:meth:`SlurmCluster.gate`)."""

    reader: int
    path: Path
    name: str = ""
    released: bool = False

    def wait_held(self, timeout: float = 60.0) -> str:
        """Wait until a request is held; its job name."""
        assert select.select([self.reader], [], [], timeout)[0], f"no request held within {timeout:g}s"
        self.name = os.read(self.reader, 200).decode().strip()
        return self.name

    def release(self) -> None:
        """Let the held request go on: Slurm creates its job (and grants it, if it can)."""
        with open(self.path, "w") as gate:  # (the script waits on the other end)
            gate.write("go\n")
        self.released = True


#: The controller's job_submit script (beside slurm.conf): the gate of SlurmCluster.gate. While
#: the file ``armed`` names a kind, the next such request for a ``skyward-*`` job writes its name
#: to the FIFO ``held``, then waits for a line on the FIFO ``gate``.
GATE_LUA = """\
function slurm_job_submit(job_desc, part_list, submit_uid)
  local armed = io.open("{base}/armed", "r")
  if armed == nil then return slurm.SUCCESS end
  local kind = armed:read("*l")
  armed:close()
  local name = job_desc.name or ""
  if string.sub(name, 1, 8) ~= "skyward-" or (kind == "batch") ~= (job_desc.script ~= nil) then
    return slurm.SUCCESS
  end
  os.remove("{base}/armed")
  local held = io.open("{base}/held", "w")
  held:write(name .. "\\n")
  held:close()
  local gate = io.open("{base}/gate", "r")
  gate:read("*l")
  gate:close()
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  return slurm.SUCCESS
end
"""


def lines_until(stream, mark: str) -> str:
    """What ``stream`` says up to its first line with ``mark`` (or to its end)."""
    said = ""
    for line in stream:
        said += line
        if mark in line:
            break
    return said

def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _processes_with_env(entry: str) -> list[int]:
    found = []
    needle = entry.encode()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(name))
        except OSError:
            continue
    return found


def _conf(base: Path, bridge_ip: str, hosts: list[tuple[str, str]], ctl_port: int, slurmd_port: int,
          munge_socket: Path, accounting: str) -> str:
    node_lines = "\n".join(f"NodeName={name} NodeAddr={ip} CPUs={CPUS_PER_NODE} Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN"
                           for name, ip in hosts)
    return f"""\
ClusterName=sky{os.getpid()}
SlurmctldHost={socket.gethostname().split('.')[0]}({bridge_ip})
SlurmctldPort={ctl_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={base}/state
SlurmdSpoolDir={base}/spool/%n
SlurmctldPidFile={base}/slurmctld.pid
SlurmdPidFile={base}/slurmd-%n.pid
SlurmctldLogFile={base}/slurmctld.log
SlurmdLogFile={base}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
{accounting}
MpiDefault=none
JobSubmitPlugins=lua
GresTypes=gpu
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
ReturnToService=2
InactiveLimit=0
KillWait=2
MinJobAge=2
SlurmctldTimeout=30
SlurmdTimeout=30
{node_lines}
PartitionName={PARTITION} Nodes={','.join(n for n, _ in hosts)} Default=YES MaxTime=INFINITE PriorityTier=1 State=UP
PartitionName={URGENT} Nodes={','.join(n for n, _ in hosts)} MaxTime={URGENT_MAX_TIME} PriorityTier=10 State=UP
"""


def start(base: Path, bridge_ip: str, hosts: list[tuple[str, str, str, str]], accounting: bool = False) -> SlurmCluster:
    """Start a cluster under ``base``: ``hosts`` are (node name, address, network namespace
    path or ``pid:<pid>`` of a process whose network and UTS namespaces the node joins, and
    the directory of the host's ``hosts`` and ``resolv.conf``, or ""). ``accounting``: with
    Slurm's accounting database (see :func:`_serve_accounting`)."""
    base.mkdir(parents=True, exist_ok=True)
    for d in ("state", "spool", "munge"):
        (base / d).mkdir(exist_ok=True)
    os.chmod(base / "munge", 0o700)
    key = base / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o400)
    munge_socket = base / "munge" / "munge.sock"
    conf = base / "slurm.conf"
    # (beside slurm.conf, where slurmd looks; each "GPU" a device file that every machine has)
    (base / "job_submit.lua").write_text(GATE_LUA.format(base=base))
    (base / "gres.conf").write_text(f"Name=gpu File=/dev/tty[0-{GPUS_PER_NODE - 1}]\n")
    dbd_port = _free_port()
    enforced = ("AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=127.0.0.1\n"
                f"AccountingStoragePort={dbd_port}\nAccountingStorageEnforce=associations,limits,qos\n"
                f"AccountingStoragePass={munge_socket}")  # (the munge socket of the talks to slurmdbd)
    conf.write_text(_conf(base, bridge_ip, [(n, ip) for n, ip, _, _ in hosts], _free_port(), _free_port(),
                          munge_socket, enforced if accounting else "AccountingStorageType=accounting_storage/none"))
    cluster = SlurmCluster(base, str(conf), [n for n, *_ in hosts], {n: ip for n, ip, *_ in hosts})
    env = cluster.env
    log = open(base / "daemons.log", "ab")  # noqa: SIM115 - the daemons' own stdio, kept while they run
    try:
        cluster.daemons.append(subprocess.Popen(
            ["munged", "--foreground", "--force", f"--socket={munge_socket}", f"--key-file={key}",
             f"--pid-file={base}/munge/munged.pid", f"--seed-file={base}/munge/munged.seed",
             f"--log-file={base}/munge.log"], stdout=log, stderr=log, env=env, start_new_session=True))
        _wait_for(lambda: munge_socket.exists(), 15, "munged's socket", cluster)
        if accounting:
            _serve_accounting(cluster, munge_socket, dbd_port, log)
        cluster.daemons.append(subprocess.Popen(["slurmctld", "-D", "-i"], stdout=log, stderr=log, env=env,
                                                start_new_session=True))
        for name, _ip, netns, etc in hosts:
            enter = (["nsenter", f"--target={netns[4:]}", "--net", "--uts"] if netns.startswith("pid:")
                     else ["nsenter", f"--net={netns}"])
            cluster.slurmd_argv[name] = [*enter, *_own_resolver(etc), "slurmd", "-D", "-N", name]
            cluster.start_slurmd(name)
        cluster.wait_idle()
    except BaseException:
        cluster.stop()
        raise
    return cluster


#: The accounts and QOS of the accounting cluster's user (root); the first is the default.
ACCOUNTS = ("research", "teaching")
QOS = ("normal", "high")


def _serve_accounting(cluster: SlurmCluster, munge_socket: Path, dbd_port: int, log) -> None:
    """Slurm's accounting database: a MariaDB server of the cluster's own (its data, socket and
    port private), ``slurmdbd`` on ``dbd_port``, the cluster registered, and this user's
    associations: :data:`ACCOUNTS` and :data:`QOS`. Slurm's 22.05 slurmdbd stores only in MySQL
    or MariaDB (accounting_storage/mysql is its one storage plugin)."""
    base, db_port = cluster.base, _free_port()
    done = subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={base}/db", "--user=root",
                           "--auth-root-authentication-method=normal", "--skip-test-db"],
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"mariadb-install-db failed: {done.stdout}{done.stderr}")
    cluster.daemons.append(subprocess.Popen(
        ["mariadbd", "--no-defaults", f"--datadir={base}/db", f"--socket={base}/db.sock", f"--port={db_port}",
         "--bind-address=127.0.0.1", "--user=root", f"--pid-file={base}/db.pid", f"--log-error={base}/db.log",
         "--skip-log-bin", "--innodb-buffer-pool-size=32M"], stdout=log, stderr=log, env=cluster.env,
        start_new_session=True))
    _wait_for(lambda: (base / "db.sock").exists(), 60, "mariadbd's socket", cluster)
    grant = "CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm'; GRANT ALL ON *.* TO 'slurm'@'127.0.0.1'"
    subprocess.run(["mariadb", "--no-defaults", f"--socket={base}/db.sock", "-u", "root", "-e", grant],
                   check=True, capture_output=True, timeout=60)
    dbd_conf = base / "slurmdbd.conf"  # (beside slurm.conf, where slurmdbd looks)
    dbd_conf.write_text(f"""\
AuthType=auth/munge
AuthInfo=socket={munge_socket}
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={dbd_port}
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={db_port}
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct
LogFile={base}/slurmdbd.log
PidFile={base}/slurmdbd.pid
""")
    os.chmod(dbd_conf, 0o600)
    cluster.daemons.append(subprocess.Popen(["slurmdbd", "-D"], stdout=log, stderr=log, env=cluster.env,
                                            start_new_session=True))
    _wait_for(lambda: cluster.run("sacctmgr", "-n", "show", "cluster").returncode == 0, 60, "slurmdbd", cluster)
    name = next(line.split("=", 1)[1] for line in Path(cluster.conf).read_text().splitlines()
                if line.startswith("ClusterName="))
    for argv in (["add", "cluster", name], ["add", "account", ",".join(ACCOUNTS), f"Cluster={name}"],
                 ["add", "qos", ",".join(QOS[1:])],
                 ["add", "user", "root", f"Account={','.join(ACCOUNTS)}", f"DefaultAccount={ACCOUNTS[0]}",
                  f"Cluster={name}"],
                 ["modify", "user", "root", "set", f"QOS={','.join(QOS)}", f"DefaultQOS={QOS[0]}"]):
        done = cluster.run("sacctmgr", "-i", *argv)
        if done.returncode != 0:
            raise RuntimeError(f"sacctmgr {' '.join(argv)} failed: {done.stdout}{done.stderr}\n{cluster.logs()}")


def _own_resolver(etc: str) -> list[str]:
    """What runs slurmd with the host's ``/etc/hosts`` and ``resolv.conf`` (``etc``: their
    directory), in a mount namespace copied from this machine's, so that the node's steps see
    every file as the client does (``/sys`` too) and resolve the nodes' names as on a cluster:
    its own hostname (gloo binds to the address it resolves to, else to loopback) and no DNS
    server out of reach (torch's c10d store waited 10 s per lookup there)."""
    if not etc:
        return []
    hosts, resolv = shlex.quote(f"{etc}/hosts"), shlex.quote(f"{etc}/resolv.conf")
    return ["unshare", "--mount", "--propagation", "slave", "sh", "-c",
            f'mount --bind {hosts} /etc/hosts && mount --bind {resolv} /etc/resolv.conf && exec "$@"', "sh"]


@contextlib.contextmanager
def serving(test_hosts, accounting: bool = False) -> Iterator[SlurmCluster]:
    """A cluster on ``test_hosts`` (tests/hosts/) while the block runs, this process's Slurm
    commands (the provider's) pointed at it through ``SLURM_CONF``; everything removed after."""
    base = Path(tempfile.mkdtemp(prefix="skyward-slurm-"))
    try:
        cluster = start(base, test_hosts[0].bridge_ip,
                        [(h.name, h.ip, f"pid:{h.sshd_pid}", h.dir) for h in test_hosts], accounting)
    except BaseException:
        shutil.rmtree(base, ignore_errors=True)
        raise
    saved = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = cluster.conf
    try:
        yield cluster
    finally:
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)


def _wait_for(check, timeout: float, what: str, cluster: SlurmCluster) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not ready after {timeout:g}s\n{cluster.logs()}")
        time.sleep(0.05)


# -- what every Slurm test file uses (imported there by name) -------------------------------------
needs_slurm = pytest.mark.skipif(shutil.which("slurmctld") is None or shutil.which("munged") is None,
                                 reason="Slurm's packages (slurmctld, slurmd, slurm-client, munge) are not installed")
needs_accounting = pytest.mark.skipif(any(shutil.which(c) is None for c in ("slurmctld", "munged", "slurmdbd",
                                                                          "mariadbd", "mariadb-install-db")),
                                      reason="Slurm's packages with slurmdbd and mariadb-server are not installed")


@pytest.fixture(scope="module")
def slurm(test_hosts) -> Iterator[SlurmCluster]:
    """The test file's Slurm cluster (the provider's commands find it: SLURM_CONF)."""
    with serving(test_hosts) as cluster:
        yield cluster


@pytest.fixture(autouse=True)
def nothing_left(slurm) -> Iterator[None]:
    """After every test: no job of ours in squeue, no worker left on any node."""
    yield
    assert slurm.wait_jobs_gone() == []
    assert slurm.wait_workers_gone() == []
