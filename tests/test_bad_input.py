"""Every bad input, in one table: a ConfigError naming the parameter, the value given and what
is accepted, raised before anything starts (no worker process, no host process, no instance).

Rows are (id, what the user does, parameter, the value as the message shows it, a phrase of
what is accepted). docs/errors.md lists the same cases for readers.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest

import skyward as sky
from skyward.launch.taskfile.stores import Bucket, copy_commands, mount_command
from skyward.launch.taskfile.stores import parse as parse_store
from skyward.providers import Provider
from tests.aws_conftest import aws, moto_server  # noqa: F401  (fixtures)


@sky.compute
def one() -> int:
    return 1


@sky.compute
def add(a: int, b: int) -> int:
    return a + b


class Bad(NamedTuple):
    id: str
    do: Callable[[], Any]
    parameter: str
    shown: str
    accepted: str


def pool(**kwargs: Any) -> Callable[[], Any]:
    kwargs.setdefault("console", False)
    return lambda: sky.ComputePool(**kwargs)


def image(**kwargs: Any) -> Callable[[], Any]:
    return lambda: sky.Image(**kwargs)


def ssh(hosts: Any = ("10.0.0.1",), **kwargs: Any) -> Callable[[], Any]:
    return lambda: sky.SSH(hosts, **kwargs)


def aws_(**kwargs: Any) -> Callable[[], Any]:
    kwargs.setdefault("ssh_cidr", "198.51.100.7/32")
    return lambda: sky.AWS(**kwargs)


def pool_never_entered() -> sky.ComputePool:
    return sky.ComputePool(console=False)


POOL = [
    Bad("nodes-zero", pool(nodes=0), "nodes", "0", "an integer >= 1"),
    Bad("nodes-negative", pool(nodes=-3), "nodes", "-3", "an integer >= 1"),
    Bad("nodes-string", pool(nodes="2"), "nodes", "'2'", "an integer >= 1"),
    Bad("nodes-bool", pool(nodes=True), "nodes", "True", "an integer >= 1"),
    Bad("nodes-float", pool(nodes=2.5), "nodes", "2.5", "an integer >= 1"),
    Bad("concurrency-zero", pool(concurrency=0), "concurrency", "0", "an integer >= 1"),
    Bad("concurrency-none", pool(concurrency=None), "concurrency", "None", "an integer >= 1"),
    Bad("executor-fork", pool(executor="fork"), "executor", "'fork'", "'thread' or 'process'"),
    Bad("executor-none", pool(executor=None), "executor", "None", "'thread' or 'process'"),
    Bad("idle-timeout-zero", pool(idle_timeout=0), "idle_timeout", "0", "positive number of seconds"),
    Bad("idle-timeout-negative", pool(idle_timeout=-1), "idle_timeout", "-1", "positive number of seconds"),
    Bad("idle-timeout-inf", pool(idle_timeout=float("inf")), "idle_timeout", "inf", "not inf or nan"),
    Bad("idle-timeout-string", pool(idle_timeout="30"), "idle_timeout", "'30'", "positive number of seconds"),
    Bad("start-timeout-nan", pool(start_timeout=float("nan")), "start_timeout", "nan", "not inf or nan"),
    Bad("start-timeout-zero", pool(start_timeout=0), "start_timeout", "0", "positive number of seconds"),
    Bad("start-parallelism-zero", pool(start_parallelism=0), "start_parallelism", "0", "an integer >= 1"),
    Bad("start-parallelism-string", pool(start_parallelism="8"), "start_parallelism", "'8'", "an integer >= 1"),
    Bad("heartbeat-bool", pool(heartbeat_interval=True), "heartbeat_interval", "True", "positive number"),
    Bad("heartbeat-inf", pool(heartbeat_interval=float("inf")), "heartbeat_interval", "inf", "not inf or nan"),
    Bad("console-no", pool(console="no"), "console", "'no'", "True or False"),
    Bad("console-int", pool(console=1), "console", "1", "True or False"),
    Bad("dashboard-no", pool(dashboard="no"), "dashboard", "'no'", "True or False"),
    Bad("dashboard-int", pool(dashboard=1), "dashboard", "1", "True or False"),
    Bad("on-event-string", pool(on_event="print"), "on_event", "'print'", "a function taking one skyward event"),
    Bad("on-event-number", pool(on_event=3), "on_event", "3", "a function taking one skyward event"),
    Bad("provider-string", pool(provider="local"), "provider", "'local'", "sky.Local()"),
    Bad("provider-class", pool(provider=sky.Local), "provider", "Local", "sky.Local()"),
    Bad("plugins-string", pool(plugins="torch"), "plugins", "'torch'", "a list of sky.Plugin values"),
    Bad("plugins-bare", pool(plugins=sky.Plugin("alone")), "plugins", "alone", "a list of sky.Plugin values"),
    Bad("plugins-item", pool(plugins=["torch"]), "plugins[0]", "'torch'", "sky.Plugin"),
    Bad("plugins-second", pool(plugins=[sky.Plugin("ok"), 3]), "plugins[1]", "3", "sky.Plugin"),
    Bad("plugins-factory", pool(plugins=[sky.plugins.torch]), "plugins[0]", "function", "sky.Plugin"),
    Bad("image-dict", pool(image={"pip": ["x"]}), "image", "'pip'", "a sky.Image(...)"),
    Bad("image-string", pool(image="python:3.12"), "image", "'python:3.12'", "a sky.Image(...)"),
    Bad("accelerator-unknown", lambda: pool(provider=sky.SSH(["10.0.0.1"]), accelerator="Z9000")(),
        "accelerator", "Z9000", "A100"),
    Bad("accelerator-count", lambda: pool(provider=sky.SSH(["10.0.0.1"]), accelerator="A100:0")(),
        "accelerator", "A100:0", "A100"),
    Bad("accelerator-on-local", pool(accelerator="A100"), "accelerator", "A100:1", "None with sky.Local()"),
    Bad("accelerator-on-local-explicit", pool(provider=sky.Local(), accelerator="H100:8"), "accelerator",
        "H100:8", "None with sky.Local()"),
    Bad("ssh-nodes-mismatch", lambda: pool(provider=sky.SSH(["10.0.0.1", "10.0.0.2"]), nodes=3)(), "nodes", "3",
        "2 (one node per host given to sky.SSH)"),
]

IMAGE = [
    Bad("python-number", image(python=3.12), "python", "3.12", '"auto" or a version string'),
    Bad("python-word", image(python="latest"), "python", "'latest'", '"auto" or a version string'),
    Bad("python-two", image(python="2.7"), "python", "'2.7'", '"auto" or a version string'),
    Bad("pip-string", image(pip="numpy"), "pip", "'numpy'", "a list of requirement strings"),
    Bad("pip-option", image(pip=["--index-url=x"]), "pip[0]", "--index-url=x", "requirement strings"),
    Bad("pip-empty-item", image(pip=["numpy", ""]), "pip[1]", "''", "requirement strings"),
    Bad("pip-number", image(pip=[3]), "pip[0]", "3", "requirement strings"),
    Bad("indexes-string", image(pip_indexes="https://x.org/simple"), "pip_indexes", "https://x.org/simple",
        "a list of http(s):// or file:// URLs"),
    Bad("indexes-scheme", image(pip_indexes=["ftp://x.org/simple"]), "pip_indexes[0]", "ftp://x.org/simple",
        "http(s):// or file:// URLs"),
    Bad("indexes-no-host", image(pip_indexes=["https:///simple"]), "pip_indexes[0]", "https:///simple",
        "http(s):// or file:// URLs"),
    Bad("indexes-space", image(pip_indexes=["https://x.org/a b"]), "pip_indexes[0]", "https://x.org/a b",
        "without spaces"),
    Bad("apt-string", image(apt="ffmpeg"), "apt", "'ffmpeg'", "a list of Debian package names"),
    Bad("apt-upper", image(apt=["FFmpeg"]), "apt[0]", "FFmpeg", "Debian package names"),
    Bad("apt-shell", image(apt=["curl; rm -rf /"]), "apt[0]", "curl; rm -rf /", "Debian package names"),
    Bad("env-list", image(env=[("A", "1")]), "env", "list", "a mapping of variable names"),
    Bad("env-name-digit", image(env={"1A": "x"}), "env", "1A", "variable names matching"),
    Bad("env-name-dash", image(env={"MY-VAR": "x"}), "env", "MY-VAR", "variable names matching"),
    Bad("env-value-int", image(env={"A": 1}), "env", "1", "string values"),
    Bad("env-value-none", image(env={"A": None}), "env", "None", "string values"),
    Bad("env-value-nul", image(env={"A": "x\0y"}), "env", "x\\x00y", "without NUL characters"),
    Bad("env-secret-nul", image(env={"DB_PASS": "hunter2\0"}), "env", "'***'", "without NUL characters"),
    Bad("env-marked-secret-nul", lambda: sky.Image(env={"URL": sky.Secret("hunter2\0")}), "env", "'***'",
        "without NUL characters"),
    Bad("secret-not-string", lambda: sky.Secret(42), "Secret", "int", "a string"),
    Bad("setup-string", image(setup="make"), "setup", "'make'", "a list of shell commands"),
    Bad("setup-blank", image(setup=["  "]), "setup[0]", "'  '", "a list of shell commands"),
    Bad("include-missing", image(include=["/nonexistent/dir"]), "include[0]", "/nonexistent/dir",
        "existing local paths"),
    Bad("include-string", image(include="/tmp"), "include", "/tmp", "a list of existing local paths"),
    Bad("replace-unknown", lambda: sky.Image().replace(pips=["x"]), "replace", "pips", "one of"),
    Bad("with-pip-index", lambda: sky.Image().with_pip("x", index="ftp://x"), "pip_indexes[0]", "ftp://x",
        "http(s):// or file:// URLs"),
]

SSH = [
    Bad("hosts-string", ssh("10.0.0.1"), "hosts", "10.0.0.1", "a list of hosts"),
    Bad("hosts-empty", ssh([]), "hosts", "[]", "at least one host"),
    Bad("hosts-bad-port", ssh(["h:99999"]), "hosts[0]", "h:99999", "ports between 1 and 65535"),
    Bad("hosts-port-word", ssh(["h:ssh"]), "hosts[0]", "h:ssh", "ports between 1 and 65535"),
    Bad("hosts-two-at", ssh(["a@b@c"]), "hosts[0]", "a@b@c", 'entries like "host"'),
    Bad("hosts-space", ssh(["my host"]), "hosts[0]", "my host", 'entries like "host"'),
    Bad("hosts-ipv6-bad", ssh(["[fe80::zz]:22"]), "hosts[0]", "fe80::zz", "IPv6"),
    Bad("hosts-number", ssh([10]), "hosts[0]", "10", 'entries like "host"'),
    Bad("ssh-user-at", ssh(user="me@x"), "user", "me@x", "a login user name"),
    Bad("ssh-port-zero", ssh(port=0), "port", "0", "between 1 and 65535"),
    Bad("ssh-port-string", ssh(port="22"), "port", "'22'", "between 1 and 65535"),
    Bad("ssh-key-missing", ssh(key="/nonexistent/id"), "key", "/nonexistent/id", "private key file"),
    Bad("ssh-known-hosts-missing", ssh(known_hosts="/nonexistent/kh"), "known_hosts", "/nonexistent/kh",
        "existing known_hosts files"),
    Bad("ssh-verify-string", ssh(verify_host_keys="no"), "verify_host_keys", "'no'", "True or False"),
    Bad("ssh-root-relative", ssh(root="work"), "root", "work", "an absolute path or one starting with ~/"),
    Bad("ssh-connect-timeout-inf", ssh(connect_timeout=float("inf")), "connect_timeout", "inf", "not inf or nan"),
    Bad("ssh-connect-timeout-zero", ssh(connect_timeout=0), "connect_timeout", "0", "positive number"),
    Bad("ssh-bootstrap-timeout-neg", ssh(bootstrap_timeout=-5), "bootstrap_timeout", "-5", "positive number"),
    Bad("ssh-private-addrs-count", ssh(private_addrs=["a", "b"]), "private_addrs", "['a', 'b']",
        "1 addresses (one per host)"),
    Bad("ssh-private-addrs-string", ssh(private_addrs="10.1.1.1"), "private_addrs", "10.1.1.1",
        "a list of addresses"),
    Bad("ssh-find-links-string", ssh(find_links="/srv/wheels"), "find_links", "/srv/wheels",
        "a list of directories on the hosts or URLs"),
    Bad("ssh-no-index-string", ssh(no_index="yes"), "no_index", "'yes'", "True or False"),
    Bad("ssh-site-packages-string", ssh(system_site_packages="torch"), "system_site_packages", "'torch'",
        "True, False, or a list of distribution names"),
    Bad("ssh-site-packages-bad-name", ssh(system_site_packages=["torch cuda"]), "system_site_packages",
        "torch cuda", "distribution names"),
]

AWS_ROWS = [
    Bad("aws-region-typo", aws_(region="us-est-1"), "region", "us-est-1", "an AWS region such as 'us-east-1'"),
    Bad("aws-region-shape", aws_(region="mars-1"), "region", "mars-1", "an AWS region such as 'us-east-1'"),
    Bad("aws-region-number", aws_(region=1), "region", "1", "an AWS region"),
    Bad("aws-instance-type-number", aws_(instance_type=5), "instance_type", "5", "an EC2 instance type"),
    Bad("aws-ami-number", aws_(ami=7), "ami", "7", "an AMI id such as"),
    Bad("aws-profile-number", aws_(profile=3), "profile", "3", "the name of a profile"),
    Bad("aws-allocation", aws_(allocation="cheap"), "allocation", "'cheap'", "'spot-if-available'"),
    Bad("aws-ami", aws_(ami="ubuntu"), "ami", "ubuntu", "an AMI id such as"),
    Bad("aws-subnet", aws_(subnet_id="sn-1"), "subnet_id", "sn-1", "a subnet id such as"),
    Bad("aws-instance-type", aws_(instance_type="huge"), "instance_type", "huge", "an EC2 instance type"),
    Bad("aws-vcpus-zero", aws_(vcpus=0), "vcpus", "0", ">= 1"),
    Bad("aws-vcpus-bool", aws_(vcpus=True), "vcpus", "True", ">= 1"),
    Bad("aws-memory-negative", aws_(memory_gb=-1), "memory_gb", "-1", ">= 0.5"),
    Bad("aws-arch", aws_(arch="sparc"), "arch", "'sparc'", "'x86_64', 'arm64' or None"),
    Bad("aws-idle-timeout-short", aws_(idle_timeout=5), "idle_timeout", "5", ">= 60"),
    Bad("aws-idle-timeout-inf", aws_(idle_timeout=float("inf")), "idle_timeout", "inf", ">= 60"),
    Bad("aws-max-lifetime-nan", aws_(max_lifetime=float("nan")), "max_lifetime", "nan", ">= 300"),
    Bad("aws-max-lifetime-below-idle", aws_(idle_timeout=3600, max_lifetime=600), "max_lifetime", "600",
        "at least idle_timeout"),
    Bad("aws-ssh-cidr-garbage", aws_(ssh_cidr="not-an-address"), "ssh_cidr", "not-an-address",
        "an address range such as"),
    Bad("aws-ssh-cidr-number", aws_(ssh_cidr=3), "ssh_cidr", "3", "an address range such as"),
    Bad("aws-ssh-cidr-world", aws_(ssh_cidr="0.0.0.0/0"), "ssh_cidr", "0.0.0.0/0", "allow_ssh_from_anywhere=True"),
    Bad("aws-ssh-cidr-world-v6", aws_(ssh_cidr="::/0"), "ssh_cidr", "::/0", "allow_ssh_from_anywhere=True"),
    Bad("aws-allow-anywhere-string", aws_(allow_ssh_from_anywhere="yes"), "allow_ssh_from_anywhere", "'yes'",
        "True or False"),
    Bad("aws-ssh-key-missing", aws_(ssh_key="/nonexistent/key"), "ssh_key", "/nonexistent/key",
        "private key file"),
    Bad("aws-known-hosts-missing", aws_(known_hosts="/nonexistent/kh"), "known_hosts", "/nonexistent/kh",
        "existing known_hosts files"),
    Bad("aws-known-hosts-empty", aws_(known_hosts=[]), "known_hosts", "[]", "at least one known_hosts file"),
    Bad("aws-user", aws_(user="root@host"), "user", "root@host", "login user name"),
    Bad("aws-disk-small", aws_(disk_gb=1), "disk_gb", "1", ">= 8"),
    Bad("aws-ssh-via", aws_(ssh_via="carrier-pigeon"), "ssh_via", "'carrier-pigeon'", "'auto' or 'public'"),
    Bad("aws-public-ip-string", aws_(public_ip="yes"), "public_ip", "'yes'", "True, False or None"),
    Bad("aws-root-number", aws_(root=3), "root", "3", "an absolute path"),
    Bad("aws-root-relative", aws_(root="relative/dir"), "root", "relative/dir", "an absolute path"),
    Bad("aws-no-index-string", aws_(no_index="yes"), "no_index", "'yes'", "True or False"),
    Bad("aws-find-links-string", aws_(find_links="/srv/wheels"), "find_links", "/srv/wheels",
        "a list of directories"),
    Bad("aws-find-links-item", aws_(find_links=["/srv/wheels", 3]), "find_links[1]", "3", "a list of directories"),
    Bad("aws-session-and-profile", lambda: aws_(session=__import__("boto3").Session(), profile="dev")(),
        "profile", "'dev'", "None when a session is given"),
    Bad("aws-session-object", aws_(session=object()), "session", "object", "a boto3.Session"),
    Bad("aws-ip-lookup-url", aws_(ip_lookup_url="ftp://x"), "ip_lookup_url", "ftp://x", "an http(s) URL"),
    Bad("aws-accelerator-unoffered", lambda: sky.ComputePool(provider=sky.AWS(ssh_cidr="198.51.100.7/32"),
                                                             accelerator="T4:16", console=False),
        "accelerator", "T4:16", "offered"),
]

OPERATORS = [
    Bad("rshift-swapped", lambda: pool_never_entered() >> one(), "left-hand side of >>", "a ComputePool",
        "a pending computation, with the pool on the right"),
    Bad("matmul-swapped", lambda: pool_never_entered() @ one(), "left-hand side of @", "a ComputePool",
        "a pending computation, with the pool on the right"),
    Bad("gt-swapped", lambda: pool_never_entered() > one(), "left-hand side of >", "a ComputePool",
        "a pending computation, with the pool on the right"),
    Bad("function-not-called", lambda: one >> pool_never_entered(), "left-hand side of >>", "ComputeFunction",
        "a pending computation"),
    Bad("function-not-called-broadcast", lambda: add @ pool_never_entered(), "left-hand side of @",
        "ComputeFunction", "a pending computation"),
    Bad("number-submitted", lambda: 3 > pool_never_entered(), "left-hand side of >", "int 3", "a pending computation"),
    Bad("gather-broadcast", lambda: sky.gather(one()) @ pool_never_entered(), "left-hand side of @",
        "PendingGather", "a pending computation"),
    Bad("rshift-to-string", lambda: one() >> "pool", "right-hand side of >>", "'pool'", "a ComputePool"),
    Bad("broadcast-to-list", lambda: one() @ [1], "right-hand side of @", "list", "a ComputePool"),
    Bad("and-with-number", lambda: one() & 3, "&", "int 3", "a pending computation"),
    Bad("gather-non-pending", lambda: sky.gather(one(), 3), "gather() argument 1", "int 3", "a pending computation"),
    Bad("dispatch-unentered", lambda: one() >> pool_never_entered(), "pool", "never entered", "an open ComputePool"),
    Bad("map-not-callable", lambda: pool_never_entered().map(3, [1]), "fn", "3", "a @sky.compute function"),
]

DECORATORS_AND_PLUGINS = [
    Bad("compute-not-callable", lambda: sky.compute(3), "compute", "3", "a function"),
    Bad("compute-timeout-zero", lambda: sky.compute(timeout=0)(lambda: 1), "timeout", "0", "a positive number"),
    Bad("compute-timeout-nan", lambda: sky.compute(timeout=float("nan"))(lambda: 1), "timeout", "nan",
        "a positive number"),
    Bad("compute-timeout-inf", lambda: sky.compute(timeout=float("inf"))(lambda: 1), "timeout", "inf",
        "a positive number"),
    Bad("compute-name-empty", lambda: sky.compute(name="")(lambda: 1), "name", "''", "a non-empty string"),
    Bad("stdout-only", lambda: sky.stdout(only="tail"), "only", "'tail'", '"head", a predicate'),
    Bad("plugin-name", lambda: sky.Plugin(""), "Plugin.name", "''", "a non-empty string"),
    Bad("plugin-hook", lambda: sky.Plugin("p", transform=3), "Plugin.transform", "3", "a callable or None"),
    Bad("torch-backend", lambda: sky.plugins.torch(backend="mpi"), "backend", "'mpi'", '"nccl" or "gloo"'),
    Bad("torch-cuda", lambda: sky.plugins.torch(cuda="12.1"), "cuda", "'12.1'", "a CUDA wheel suffix"),
    Bad("torch-version", lambda: sky.plugins.torch(version=""), "version", "''", '"latest", a version'),
    Bad("torch-timeout", lambda: sky.plugins.torch(timeout=-1), "timeout", "-1", "a positive number of seconds"),
    Bad("torch-timeout-inf", lambda: sky.plugins.torch(timeout=float("inf")), "timeout", "inf",
        "a positive number of seconds"),
    Bad("keras-backend", lambda: sky.plugins.keras(backend="theano"), "backend", "'theano'", '"jax", "torch"'),
    Bad("jax-port-offset", lambda: sky.plugins.jax(port_offset=0), "port_offset", "0", "an integer from 1 to 1000"),
    Bad("shard-nothing", lambda: sky.shard(), "arrays", "()", "at least one array"),
    Bad("compute-retries-negative", lambda: sky.compute(retries=-1)(lambda: 1), "retries", "-1", "an integer >= 0"),
    Bad("compute-retries-bool", lambda: sky.compute(retries=True)(lambda: 1), "retries", "True", "an integer >= 0"),
    Bad("with-options-retries", lambda: one().with_options(retries=1.5), "retries", "1.5", "an integer >= 0"),
    Bad("with-options-timeout", lambda: one().with_options(timeout=0), "timeout", "0", "a positive number"),
]


class _FixedOnly(Provider):
    """A provider that cannot add machines to a running pool (no ``acquire``)."""

    name = "fixed-only"

    def provision(self, spec: Any) -> list[Any]:
        raise AssertionError("never reached")

    def terminate(self, instances: list[Any]) -> None:
        return None


ELASTIC = [
    Bad("nodes-min-above-max", pool(nodes=(3, 1)), "nodes", "(3, 1)", "(min, max) with 1 <= min <= max"),
    Bad("nodes-min-zero", pool(nodes=(0, 2)), "nodes", "(0, 2)", "(min, max) with 1 <= min <= max"),
    Bad("nodes-three", pool(nodes=(1, 2, 3)), "nodes", "(1, 2, 3)", "(min, max)"),
    Bad("nodes-tuple-float", pool(nodes=(1, 2.0)), "nodes", "(1, 2.0)", "(min, max)"),
    Bad("scale-up-after-zero", pool(nodes=(1, 2), scale_up_after=0), "scale_up_after", "0", "positive number"),
    Bad("scale-down-after-inf", pool(nodes=(1, 2), scale_down_after=float("inf")), "scale_down_after", "inf",
        "not inf or nan"),
    Bad("replace-lost-string", pool(replace_lost="yes"), "replace_lost", "'yes'", "True, False or None"),
    Bad("elastic-named-cluster", pool(nodes=(1, 2), name="dev"), "nodes", "(1, 2)", "not supported yet"),
    Bad("ssh-elastic-above-hosts", lambda: sky.ComputePool(provider=sky.SSH(["10.0.0.1"]), nodes=(1, 2),
                                                           console=False), "nodes", "(1, 2)", "max <= 1"),
    Bad("provider-cannot-grow", pool(provider=_FixedOnly(), nodes=(1, 2)), "nodes", "(1, 2)",
        "cannot add machines"),
    Bad("provider-cannot-replace", pool(provider=_FixedOnly(), replace_lost=True), "replace_lost", "True",
        "cannot add machines"),
]

CLUSTERS_AND_STORES = [
    Bad("down-unnamed", pool(down=True), "down", "True", "False for an unnamed pool"),
    Bad("down-string", pool(name="dev", down="yes"), "down", "'yes'", "True or False"),
    Bad("idle-minutes-negative", pool(name="dev", idle_minutes=-1), "idle_minutes", "-1", "minutes >= 0"),
    Bad("store-url-scheme", lambda: parse_store("ftp://h/x"), "file_mounts source", "'ftp://h/x'", "a bucket URL"),
    Bad("store-cos-no-bucket", lambda: parse_store("cos://eu-de"), "file_mounts source", "'cos://eu-de'",
        "cos://REGION/BUCKET"),
    Bad("copy-tool-unknown", lambda: copy_commands(Bucket("gs", "b"), "wget", "/d"), "tool", "'wget'", "gsutil"),
    Bad("mount-tool-unknown", lambda: mount_command(Bucket("s3", "b"), "wget", "/m"), "tool", "'wget'", "goofys"),
]

LOCAL_ROWS = POOL + IMAGE + SSH + OPERATORS + DECORATORS_AND_PLUGINS + ELASTIC + CLUSTERS_AND_STORES


def children() -> set[int]:
    """Live processes whose parent is this test process (Local workers are)."""
    me = str(os.getpid())
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me and fields[0] != "Z":
            found.add(int(entry))
    return found


def check(row: Bad) -> sky.ConfigError:
    before = children()
    with pytest.raises(sky.ConfigError) as info:
        row.do()
    error = info.value
    text = str(error)
    assert error.parameter == row.parameter, text
    assert f"invalid {row.parameter}" in text
    assert row.shown in text, text
    assert row.accepted in error.accepted and error.accepted in text, text
    assert error.accepted.strip(), text
    assert children() <= before, "a process was started"
    return error


def test_the_table_has_every_row() -> None:
    assert len(LOCAL_ROWS) + len(AWS_ROWS) >= 100
    ids = [r.id for r in LOCAL_ROWS + AWS_ROWS]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("row", LOCAL_ROWS, ids=[r.id for r in LOCAL_ROWS])
def test_bad_input_is_refused_before_anything_starts(row: Bad) -> None:
    check(row)


@pytest.mark.parametrize("row", AWS_ROWS, ids=[r.id for r in AWS_ROWS])
def test_bad_aws_input_is_refused_before_any_instance(row: Bad, aws) -> None:  # noqa: F811
    check(row)
    reservations = aws.client().describe_instances()["Reservations"]
    assert reservations == [], "an instance was launched"
    assert aws.client().describe_security_groups(Filters=[{"Name": "tag-key", "Values": ["skyward:pool"]}])[
        "SecurityGroups"] == []


def test_a_bad_dashboard_switch_in_the_environment_names_the_variable(monkeypatch) -> None:
    monkeypatch.setenv("SKYWARD_DASHBOARD", "yes")
    check(Bad("env-dashboard", pool(), "SKYWARD_DASHBOARD", "yes", "1 (show running pools"))


def test_a_region_typo_from_the_environment_names_the_region(aws, monkeypatch) -> None:  # noqa: F811
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-est-1")
    error = check(Bad("env-region", lambda: sky.ComputePool(provider=sky.AWS(ssh_cidr="198.51.100.7/32"),
                                                             console=False),
                      "region", "us-est-1", "an AWS region such as 'us-east-1'"))
    assert "us-east-1" in error.detail  # did you mean
    assert error.__cause__ is None or not type(error.__cause__).__module__.startswith("botocore")


ON_HOSTS = [
    ("nodes", lambda p: sky.ComputePool(provider=p, nodes=3, console=False), "3"),
    ("accelerator", lambda p: sky.ComputePool(provider=p, nodes=2, accelerator="Z9000", console=False), "Z9000"),
    ("idle_timeout", lambda p: sky.ComputePool(provider=p, nodes=2, idle_timeout=float("inf"), console=False), "inf"),
    ("image", lambda p: sky.ComputePool(provider=p, nodes=2, image={"pip": ["x"]}, console=False), "pip"),
    ("plugins", lambda p: sky.ComputePool(provider=p, nodes=2, plugins=sky.Plugin("x"), console=False), "x"),
]


@pytest.mark.parametrize(("parameter", "make", "shown"), ON_HOSTS, ids=[r[0] for r in ON_HOSTS])
def test_bad_input_for_real_hosts_starts_nothing_on_them(test_hosts, parameter, make, shown) -> None:
    from tests.hosts import testhosts
    from tests.hosts.conftest_fixture import ssh_provider

    hosts = test_hosts[:2]
    provider = ssh_provider(hosts, "/nonexistent-wheelhouse")

    def everything() -> dict[str, set[int]]:  # sshd's sessions included: not even a connection
        return {h.name: set(testhosts._pids_in_netns(h.netns)) for h in hosts}

    def settled() -> dict[str, set[int]]:  # (an earlier test's sshd session may still be ending)
        last = everything()
        for _ in range(50):
            time.sleep(0.1)
            now = everything()
            if now == last:
                return now
            last = now
        return last

    before = settled()
    with pytest.raises(sky.ConfigError) as info:
        make(provider)
    assert info.value.parameter == parameter and shown in str(info.value)
    assert settled() == before
