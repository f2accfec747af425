"""Named clusters on AWS: machines that outlive their client, stop and start, and end only when
asked (or by their autostop).

The unit tests check the launch policy (pure functions, no I/O). The others run against the
moto server with instances placed at the SSH test hosts' addresses (as tests/test_aws_e2e.py
does), so a cluster's resident workers really run on the hosts and every later step (attach,
``skyward stop``/``start``/``down``, from other processes) goes through the record's pickled
provider. What moto cannot do is run the instances' watchdog: where a test needs "the machine
powered itself off" (the watchdog's job once the workers stop touching the heartbeat file), it
asks moto to stop or terminate the instances, as EC2 would under the launch's shutdown
behaviour, and says so.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import skyward as sky
from skyward.clusters import manage
from skyward.providers.aws import catalog, catalog_cache, watchdog
from skyward.providers.aws import ec2 as api
from skyward.providers.aws.provider import AWS
from skyward.testing import aws_bookkeeping
from tests.aws_conftest import aws, moto_server  # noqa: F401  (fixtures)
from tests.conftest import pid_alive, wait_gone
from tests.contract.test_clusters import home  # noqa: F401  (a SKYWARD_HOME of the test's own; clusters ended after)
from tests.hosts import testhosts
from tests.test_aws import hooked, is_spot, refuse, spec
from tests.test_aws_e2e import subnet_with_only
from tests.test_ssh import leftovers, wait_until, wheelhouse  # noqa: F401  (wheelhouse is a fixture)

ROOT = Path(__file__).resolve().parents[1]
hosts_needed = pytest.mark.skipif(testhosts.unavailable_reason() is not None,
                                  reason=str(testhosts.unavailable_reason()))


# -- the launch policy (pure) ---------------------------------------------------------------------


def test_a_named_clusters_instances_stop_when_powered_off_and_have_no_hard_lifetime() -> None:
    policy = watchdog.power_off_policy
    # an ordinary pool: powering off terminates; the 24 h lifetime stays
    assert policy(cluster=False, down=False, max_lifetime=86400.0, max_lifetime_given=False) == ("terminate", 86400.0)
    # a named cluster: powering off stops it (disk kept); no lifetime unless one was given
    assert policy(cluster=True, down=False, max_lifetime=86400.0, max_lifetime_given=False) == ("stop", None)
    assert policy(cluster=True, down=False, max_lifetime=7200.0, max_lifetime_given=True) == ("stop", 7200.0)
    # autostop with down: powering off terminates it
    assert policy(cluster=True, down=True, max_lifetime=86400.0, max_lifetime_given=False) == ("terminate", None)

    text = watchdog.user_data(idle_timeout=600, max_lifetime=None)
    config = json.loads(text.removeprefix("#cloud-config\n"))
    assert "bootcmd" not in config  # no `shutdown -h +N` armed at boot
    script = next(f["content"] for f in config["write_files"] if f["path"].endswith("skyward-watchdog"))
    assert "LIFETIME=0\n" in script and "IDLE=600\n" in script
    assert 'chmod 0666 "$HEARTBEAT"' in script  # the workers (the SSH user) may touch it

    def request(market: str, shutdown: str) -> dict:
        return api.run_instances_request(
            pool_id="p", count=1, instance_type="t3.micro", image_id="ami-1", subnet_id="s", group_id="g",
            key_name="k", market=market, user_data=text, client_token="t", shutdown_behavior=shutdown)

    assert request("on-demand", "stop")["InstanceInitiatedShutdownBehavior"] == "stop"
    assert request("spot", "stop")["InstanceInitiatedShutdownBehavior"] == "terminate"  # a one-time spot cannot stop
    assert request("on-demand", "terminate")["InstanceInitiatedShutdownBehavior"] == "terminate"


def test_the_aws_provider_survives_pickling_without_its_lock_client_or_session() -> None:
    import boto3

    provider = AWS(region="us-east-1", allocation="on-demand", max_lifetime=3600.0, ssh_cidr="10.0.0.1/32",
                   session=boto3.Session(aws_access_key_id="AKIAEXAMPLE", aws_secret_access_key="s3cret",
                                         region_name="us-east-1"))
    blob = pickle.dumps(provider)
    assert b"s3cret" not in blob  # the session (credentials) is not kept in the record
    again = pickle.loads(blob)
    assert repr(again) == repr(provider)
    assert (again.region, again.allocation, again.max_lifetime, again.ssh_cidr) == (
        "us-east-1", "on-demand", 3600.0, "10.0.0.1/32")
    kept = aws_bookkeeping(again)
    assert again.session is None and kept.pools == {} and kept.owners == {}
    with kept.lock:  # a lock of its own, usable
        pass


# -- on moto, with the SSH test hosts as instances ------------------------------------------------


@sky.compute
def worker_pid() -> int:
    return os.getpid()


@pytest.fixture
def cluster_on_hosts(aws, home, test_hosts, wheelhouse) -> dict:  # noqa: F811  (fixtures: aws first, so home ends first)
    """The AWS arguments that launch 2 on-demand instances at the test hosts' addresses."""
    hosts = test_hosts[:2]
    network = ipaddress.ip_interface(f"{hosts[0].bridge_ip}/24").network
    subnet = subnet_with_only(aws, network, [h.ip for h in hosts])
    kwargs = dict(subnet_id=subnet, ami=aws.ami, allocation="on-demand", user=hosts[0].user,
                  ssh_key=hosts[0].key_path, known_hosts=hosts[0].known_hosts_all,
                  ssh_cidr=f"{hosts[0].bridge_ip}/32", find_links=[wheelhouse], no_index=True, connect_timeout=5,
                  boot_timeout=60)
    return {"hosts": hosts, "kwargs": kwargs}


def name() -> str:
    return "a" + uuid.uuid4().hex[:8]


def states(env, ids: list[str]) -> set[str]:
    return {i["State"]["Name"] for r in env.client().describe_instances(InstanceIds=ids)["Reservations"]
            for i in r["Instances"]}


def attribute(env, ids: list[str], which: str) -> list[str]:
    key = which[0].upper() + which[1:]
    return [env.client().describe_instance_attribute(InstanceId=i, Attribute=which)[key]["Value"] for i in ids]


def skyward(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """The command line, in a process of its own (its own unpickled provider)."""
    return subprocess.run([sys.executable, "-m", "skyward.cli", *args], env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=timeout)


ATTACH = """
import os, sys
import skyward as sky

@sky.compute
def worker_pid():
    return os.getpid()

with sky.ComputePool(name=sys.argv[1], console=False) as pool:
    print(*(worker_pid() @ pool))
"""


@hosts_needed
@pytest.mark.timeout(300)  # (50 s on a quiet machine; a loaded one took over 120)
def test_a_named_aws_cluster_is_attached_stopped_started_and_ended_from_other_processes(aws, cluster_on_hosts):  # noqa: F811
    hosts = cluster_on_hosts["hosts"]
    cluster = name()
    with sky.ComputePool(name=cluster, provider=AWS(**cluster_on_hosts["kwargs"]), nodes=2, console=False) as pool:
        ids = [i.id for i in pool.instances]
        pids = worker_pid() @ pool
    # launched to stop (not terminate) when powered off, with no hard lifetime armed at boot
    assert attribute(aws, ids, "instanceInitiatedShutdownBehavior") == ["stop", "stop"]
    user_data = base64.b64decode(attribute(aws, ids, "userData")[0]).decode()
    assert "bootcmd" not in user_data and "LIFETIME=0" in user_data
    assert all(pid_alive(p) for p in pids), "leaving the block ended the cluster's workers"

    # another process attaches by name alone (the record's provider, unpickled): same workers
    out = subprocess.run([sys.executable, "-c", ATTACH, cluster], env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert [int(p) for p in out.stdout.split()] == pids

    # skyward stop: workers ended, instances stopped, status STOPPED
    stopped = skyward("stop", cluster)
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    assert states(aws, ids) == {"stopped"}
    assert wait_gone(pids, 10) == []
    assert [s.status for s in manage.status([cluster])] == ["STOPPED"]

    # skyward start: running again, new workers, tasks run
    started = skyward("start", cluster)
    assert started.returncode == 0, started.stderr[-3000:]
    assert states(aws, ids) == {"running"}
    assert [s.status for s in manage.status([cluster])] == ["UP"]
    with sky.ComputePool(name=cluster, console=False) as pool:
        again = worker_pid() @ pool
        assert [i.id for i in pool.instances] == ids  # same machines, same node numbers
    assert set(again).isdisjoint(pids)

    # The machines power themselves off (the watchdog, once the workers stop touching the
    # heartbeat; the launch made that a stop). moto runs no watchdog: EC2's side is asked here.
    aws.client().stop_instances(InstanceIds=ids)
    assert [s.status for s in manage.status([cluster])] == ["STOPPED"]
    with sky.ComputePool(name=cluster, console=False) as pool:  # attaching starts them again
        assert states(aws, ids) == {"running"}
        third = worker_pid() @ pool
    assert set(third).isdisjoint(again)
    assert wait_gone(again, 10) == []  # (on the hosts, which did not really stop, the old ones ended)

    # skyward down: instances terminated, key pair and security group deleted (the aws
    # fixture checks that nothing is left), no worker on any host, the record and keys gone
    ended = skyward("down", cluster)
    assert ended.returncode == 0, ended.stderr[-3000:]
    assert states(aws, ids) <= {"shutting-down", "terminated"}
    assert aws.leftovers() == {}
    assert wait_until(lambda: not leftovers(hosts, r"skyward\.worker"), timeout=10), leftovers(hosts)
    assert manage.ClusterStore().all() == []


SPOT_PRICE = 0.0123  # t3.medium's, in the catalog cached for these tests (the bundled one has no spot prices)


def cache_spot_prices(region: str) -> None:
    """A refreshed catalog in SKYWARD_HOME, as `skyward catalog refresh` writes it, with a spot price."""
    path = catalog_cache.cache_path(region)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"region": region, "fetched_at": "2026-01-01T00:00:00Z", "sources": {},
                                "instance_types": catalog_cache.instance_records(catalog.load_catalog()),
                                "spot_prices": {"t3.medium": SPOT_PRICE}}))


def status_column(cluster: str, column: str) -> str:
    """One column of the cluster's row in `skyward status` (run as the user runs it)."""
    shown = skyward("status", cluster)
    assert shown.returncode == 0, shown.stderr[-3000:]
    header, row = shown.stdout.splitlines()[:2]
    return row[header.index(column):].split()[0]


@hosts_needed
@pytest.mark.parametrize("allocation", ["on-demand", "spot"])
def test_a_named_aws_clusters_status_shows_the_catalog_price_of_what_was_launched(
        aws, cluster_on_hosts, home, allocation):  # noqa: F811
    cache_spot_prices(aws.region)
    kwargs = {**cluster_on_hosts["kwargs"], "allocation": allocation, "instance_type": "t3.medium"}
    cluster = name()
    with sky.ComputePool(name=cluster, provider=AWS(**kwargs), nodes=2, console=False) as pool:
        assert {i.spot for i in pool.instances} == {allocation == "spot"}
    each = SPOT_PRICE if allocation == "spot" else catalog.by_name("t3.medium").price_per_hour
    [state] = manage.status([cluster])
    assert state.as_dict()["price_per_hour"] == pytest.approx(2 * each)  # the cluster's: 2 nodes
    assert status_column(cluster, "$/H") == f"{2 * each:.3f}"  # below a dollar: a tenth of a cent
    ended = skyward("down", cluster)
    assert ended.returncode == 0, ended.stderr[-3000:]


def test_a_spot_launch_that_fell_back_to_on_demand_is_priced_on_demand(aws, home):  # noqa: F811
    cache_spot_prices(aws.region)
    session = hooked(("before-call.ec2.RunInstances",
                      refuse("InsufficientInstanceCapacity", "There is no Spot capacity available", when=is_spot)))
    p = AWS(ami=aws.ami, ssh_cidr="198.51.100.7/32", instance_type="t3.medium", session=session)
    instances = p.provision(spec(2))
    try:
        assert [(i.spot, i.price_per_hour) for i in instances] == [
            (False, catalog.by_name("t3.medium").price_per_hour)] * 2
    finally:
        p.terminate(instances)
    spot = AWS(ami=aws.ami, ssh_cidr="198.51.100.7/32", instance_type="t3.medium", allocation="spot")
    instances = spot.provision(spec(1))
    try:
        assert [(i.spot, i.price_per_hour) for i in instances] == [(True, SPOT_PRICE)]
    finally:
        spot.terminate(instances)


@pytest.fixture
def heartbeat() -> Iterator[Path]:
    """A heartbeat file of this test's own, made as the watchdog makes its
    ``/var/lib/skyward/heartbeat`` (mode 0666, here in a folder every host user can reach: the
    hosts share this machine's files), with an old modification time. Not the machine-wide
    file: another suite's clusters on these hosts would touch that one."""
    folder = Path(tempfile.mkdtemp(prefix="skyward-heartbeat-"))
    folder.chmod(0o755)
    path = folder / "heartbeat"
    path.touch()
    path.chmod(0o666)
    old = time.time() - 3600
    os.utime(path, (old, old))
    yield path
    shutil.rmtree(folder, ignore_errors=True)


@hosts_needed
def test_autostop_with_down_lets_the_machines_go_and_status_removes_what_is_left(
        aws, cluster_on_hosts, heartbeat):  # noqa: F811
    cluster = name()
    provider = AWS(**cluster_on_hosts["kwargs"])
    provider.heartbeat_file = str(heartbeat)
    with sky.ComputePool(name=cluster, provider=provider, nodes=2, idle_minutes=0.05,
                         down=True, console=False) as pool:
        ids = [i.id for i in pool.instances]
        pids = worker_pid() @ pool
        # the workers keep their machines up through the watchdog's heartbeat file
        assert time.time() - heartbeat.stat().st_mtime < 15, "the cluster's workers do not touch the heartbeat"
    assert attribute(aws, ids, "instanceInitiatedShutdownBehavior") == ["terminate", "terminate"]
    assert wait_gone(pids, 20) == [], "autostop did not end the workers"
    old = time.time() - 3600
    os.utime(heartbeat, (old, old))
    time.sleep(11)  # (a worker touches it every 10 s while in use)
    assert heartbeat.stat().st_mtime == pytest.approx(old, abs=1), "nothing may keep the machine up after autostop"

    # The watchdog would now power them off, which terminates them (down). moto runs no
    # watchdog: EC2's side is asked here.
    aws.client().terminate_instances(InstanceIds=ids)
    assert manage.status([cluster]) == []  # gone: forgotten, and its key pair and security group removed
    assert aws.leftovers() == {}


KILLED = """
import json, pathlib, sys, time
import skyward as sky
from skyward import events as ev
from skyward.providers.aws.provider import AWS

def hold(event):  # (the launch stops once its machines are up: the kill lands while launching)
    if isinstance(event, ev.NodeStage) and event.stage == "bootstrapping":
        pathlib.Path(sys.argv[3]).touch()
        time.sleep(3600)

with sky.ComputePool(name=sys.argv[1], provider=AWS(**json.loads(sys.argv[2])), nodes=2, console=False,
                     on_event=hold):
    pass
"""


@hosts_needed
@pytest.mark.parametrize("how", ["name", "all"])
def test_a_cluster_whose_client_was_killed_while_launching_is_removed_by_down(
        aws, cluster_on_hosts, home, how):  # noqa: F811
    hosts = cluster_on_hosts["hosts"]
    cluster = name()
    held = Path(home, "held")
    client = subprocess.Popen([sys.executable, "-c", KILLED, cluster, json.dumps(cluster_on_hosts["kwargs"]), str(held)],
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    try:
        launched = wait_until(lambda: held.exists() or client.poll() is not None, timeout=60, interval=0.05)
        assert launched and held.exists(), client.stderr.read() if client.poll() is not None else "never held"
        assert states_of_tagged(aws) == {"running"}
    finally:
        client.send_signal(signal.SIGKILL)
        client.wait()
    [state] = manage.status([cluster])
    assert state.status == "INIT"
    assert any(Path(home, "aws").iterdir()), "the cluster's pool keeps its files under SKYWARD_HOME"

    ended = skyward("down", cluster) if how == "name" else skyward("down", "--all", "-y")
    assert ended.returncode == 0, ended.stdout + ended.stderr[-3000:]
    assert aws.leftovers() == {}
    assert manage.ClusterStore().all() == []
    assert not any(Path(home, "aws").iterdir())
    assert wait_until(lambda: not leftovers(hosts, r"skyward\.worker"), timeout=10), leftovers(hosts)


def states_of_tagged(env) -> set[str]:
    tagged = [{"Name": "tag-key", "Values": ["skyward:pool"]}]
    return {i["State"]["Name"] for r in env.client().describe_instances(Filters=tagged)["Reservations"]
            for i in r["Instances"]}
