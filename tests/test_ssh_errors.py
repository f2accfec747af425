"""SSH pools that cannot start say which host, which step and why — and leave nothing behind."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
import time

import pytest

import skyward as sky
from skyward.errors import BootstrapError, ConfigError
from skyward.providers.ssh import SSH
from tests.test_ssh import leftovers, pool_on, ssh_provider, unique_image, wheelhouse  # noqa: F401


def start_failure(hosts, wheelhouse, image=None, **provider_options) -> BootstrapError:
    """Start a pool that must fail; return its error after checking no skyward process is left."""
    provider = ssh_provider(hosts, wheelhouse, **provider_options)
    with pytest.raises(BootstrapError) as caught:
        with pool_on(hosts, wheelhouse, image or sky.Image(), provider=provider):
            pass
    reachable = [h for h in hosts if h.sshd_pid is not None]
    assert not leftovers(reachable), leftovers(reachable)
    return caught.value


# -- reaching the host --------------------------------------------------------------------------------


def test_an_unreachable_host_is_named_with_the_connect_step(test_hosts, wheelhouse):
    good = test_hosts[0]
    # An address on the hosts' own subnet where nothing answers.
    absent = str(ipaddress.ip_address(good.ip) + 200)
    provider = SSH([good.ip, absent], user=good.user, key=good.key_path, known_hosts=good.known_hosts_all,
                   find_links=[wheelhouse], no_index=True, connect_timeout=3)
    started = time.monotonic()
    with pytest.raises(BootstrapError) as caught:
        with sky.ComputePool(provider=provider, nodes=2, console=False):
            pass
    err = caught.value
    assert time.monotonic() - started < 30
    assert err.host == f"root@{absent}" and err.step == "connect" and err.node == 1
    assert "cannot reach" in str(err) or "no answer" in str(err)
    assert absent in str(err) and err.log_tail
    assert not leftovers([good])


def test_a_refused_key_says_authentication_was_refused(test_hosts, wheelhouse, tmp_path):
    wrong = tmp_path / "wrong_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong)], check=True)
    err = start_failure(test_hosts[:2], wheelhouse, key=str(wrong))
    assert err.step == "connect"
    assert err.host in {f"root@{h.ip}" for h in test_hosts[:2]}
    assert "authentication as 'root' was refused" in str(err) and str(wrong) in str(err)
    assert type(err.__cause__).__name__ == "AuthenticationException"  # translated, with its cause kept


def test_an_unknown_host_key_is_refused_when_verification_is_on(test_hosts, wheelhouse):
    first, second = test_hosts[:2]
    # first's known_hosts file lists only first's key.
    err = start_failure([first, second], wheelhouse, known_hosts=first.known_hosts)
    assert err.step == "connect" and err.host == f"root@{second.ip}" and err.node == 1
    assert "is not in" in str(err) and first.known_hosts in str(err) and "SHA256:" in str(err)
    assert "verify_host_keys=False" in str(err)


def test_turning_verification_off_accepts_unknown_host_keys(test_hosts, wheelhouse):
    first, second = test_hosts[:2]
    provider = ssh_provider([first, second], wheelhouse, known_hosts=first.known_hosts, verify_host_keys=False)
    with pool_on([first, second], wheelhouse, sky.Image(), provider=provider) as pool:
        assert len(pool.worker_pids()) == 2
    assert not leftovers([first, second])


_CONNECTS = """
import json, os, sys
from skyward.errors import BootstrapError
from skyward.transport.ssh import SSHTransport
host, known, times = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
opened = []
sys.addaudithook(lambda event, args: opened.append(1) if event == "open" and args[0] == known
                 and "w" not in str(args[1]) else None)  # (read, not rewritten below)
said = []
for _ in range(times):
    t = SSHTransport(host["ip"], user=host["user"], key_filename=host["key"], known_hosts=[known])
    try:
        t.connect()
        said.append("connected")
    except BootstrapError as exc:
        said.append(str(exc))
    finally:
        t.close()
    if len(said) == 1 and len(sys.argv) > 4:  # then the file changes: its new version is read
        with open(known, "w") as f:
            f.write(sys.argv[4])
        os.utime(known, ns=(1, os.stat(known).st_mtime_ns + 10**9))
print(json.dumps({"opened": len(opened), "said": said}))
"""


def connects(host, known: str, times: int, *then: str) -> dict:
    """Connect to ``host`` ``times`` times in a fresh interpreter, checking keys against ``known``
    (rewritten with ``then`` after the first, if given): how often the file was opened, and each
    connect's outcome."""
    spec = json.dumps({"ip": host.ip, "user": host.user, "key": host.key_path})
    done = subprocess.run([sys.executable, "-c", _CONNECTS, spec, known, str(times), *then],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_known_hosts_file_is_read_once_while_it_does_not_change(test_hosts, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text(open(test_hosts[0].known_hosts_all).read())
    assert connects(test_hosts[0], str(known), 3) == {"opened": 1, "said": ["connected"] * 3}


def test_a_known_hosts_file_that_changes_is_read_again(test_hosts, tmp_path):
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    known = tmp_path / "known_hosts"
    known.write_text(open(test_hosts[0].known_hosts_all).read())
    wrong = f"{test_hosts[0].ip} " + " ".join(other.with_suffix(".pub").read_text().split()[:2]) + "\n"
    got = connects(test_hosts[0], str(known), 2, wrong)
    assert got["opened"] == 2 and got["said"][0] == "connected"
    assert "does not match the one in" in got["said"][1], got


# -- building the environment --------------------------------------------------------------------------


def test_a_pip_package_that_does_not_exist_fails_the_pip_step(test_hosts, wheelhouse):
    hosts = test_hosts[:2]
    err = start_failure(hosts, wheelhouse, unique_image(pip=["skyward-no-such-package-4242"]))
    assert err.step == "pip" and err.exit_code not in (None, 0)
    assert err.host in {f"root@{h.ip}" for h in hosts} and err.host in str(err)
    assert any("skyward-no-such-package-4242" in line for line in err.log_tail)


def test_a_failing_setup_command_fails_the_setup_step_with_its_output(test_hosts, wheelhouse):
    hosts = test_hosts[:2]
    err = start_failure(hosts, wheelhouse, unique_image(setup=["echo 'the setup is failing now' >&2; exit 7"]))
    assert err.step == "setup" and err.exit_code not in (None, 0)
    assert any("the setup is failing now" in line for line in err.log_tail)
    assert "setup command 1 of 1 failed" in str(err)


def test_a_build_past_bootstrap_timeout_is_stopped_on_the_host(test_hosts, wheelhouse):
    hosts = test_hosts[:1]
    image = unique_image(setup=["echo slow setup; sleep 4747"])
    started = time.monotonic()
    err = start_failure(hosts, wheelhouse, image, bootstrap_timeout=2)
    assert time.monotonic() - started < 20
    assert err.step == "setup" and "longer than 2s" in str(err) and "slow setup" in err.log_tail
    assert hosts[0].processes("sleep 4747") == []


def test_a_failed_build_does_not_count_as_warm_the_next_time(test_hosts, wheelhouse):
    host = test_hosts[:1]
    image = unique_image(setup=["test -e /opt/skyward-work/allow-setup-$SKYWARD_TEST_RUN"])
    assert start_failure(host, wheelhouse, image).step == "setup"
    flag = f"{host[0].workdir}/allow-setup-{image.env['SKYWARD_TEST_RUN']}"
    open(flag, "w").close()
    with pool_on(host, wheelhouse, image) as pool:
        assert pool.is_open


# -- bad arguments, before anything connects -------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "parameter"), [
    ({"hosts": "10.0.0.1"}, "hosts"),
    ({"hosts": []}, "hosts"),
    ({"hosts": ["user@host:99999"]}, "hosts[0]"),
    ({"hosts": ["h", "a b"]}, "hosts[1]"),
    ({"hosts": ["@h"]}, "hosts[0]"),
    ({"hosts": ["[fe80::1"]}, "hosts[0]"),
    ({"hosts": ["[not-v6]:22"]}, "hosts[0]"),
    ({"hosts": ["h:"]}, "hosts[0]"),
    ({"hosts": ["h:ssh"]}, "hosts[0]"),
    ({"hosts": [3]}, "hosts[0]"),
    ({"hosts": ["h"], "port": 70000}, "port"),
    ({"hosts": ["h"], "port": "22"}, "port"),
    ({"hosts": ["h"], "bootstrap_timeout": float("inf")}, "bootstrap_timeout"),
    ({"hosts": ["h"], "no_index": "yes"}, "no_index"),
    ({"hosts": ["h"], "user": "a@b"}, "user"),
    ({"hosts": ["h"], "port": 0}, "port"),
    ({"hosts": ["h"], "key": "/nonexistent/key"}, "key"),
    ({"hosts": ["h"], "known_hosts": "/nonexistent/known_hosts"}, "known_hosts"),
    ({"hosts": ["h"], "root": "relative/dir"}, "root"),
    ({"hosts": ["h"], "connect_timeout": 0}, "connect_timeout"),
    ({"hosts": ["h", "g"], "private_addrs": ["10.0.0.1"]}, "private_addrs"),
    ({"hosts": ["h"], "find_links": "/srv/wheels"}, "find_links"),
    ({"hosts": ["h"], "system_site_packages": ["torch; rm -rf /"]}, "system_site_packages"),
    ({"hosts": ["h"], "verify_host_keys": "no"}, "verify_host_keys"),
])
def test_invalid_arguments_raise_config_error_naming_the_parameter(kwargs, parameter):
    with pytest.raises(ConfigError) as caught:
        SSH(**kwargs)
    assert caught.value.parameter == parameter


def test_host_strings_give_user_address_and_port():
    ssh = SSH(["h1", "bob@h2", "h3:2222", "carol@10.0.0.4:2200", "[fe80::1]:23", "::1"], user="alice", port=22)
    assert ssh.hosts == (("alice", "h1", 22), ("bob", "h2", 22), ("alice", "h3", 2222),
                         ("carol", "10.0.0.4", 2200), ("alice", "fe80::1", 23), ("alice", "::1", 22))


def test_a_host_alias_in_ssh_config_gives_its_address_user_and_port(tmp_path, monkeypatch):
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text(
        "Host gpu1\n  HostName 10.1.2.3\n  User dana\n  Port 2201\n\nHost *\n  User erin\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    ssh = SSH(["gpu1", "bob@gpu1:23", "other"])
    # The entry wins over ~/.ssh/config, which wins over the defaults.
    assert ssh.hosts == (("dana", "10.1.2.3", 2201), ("bob", "10.1.2.3", 23), ("erin", "other", 22))
    assert ssh.private_addrs == ("10.1.2.3", "10.1.2.3", "other")
    assert SSH(["gpu1"], user="fay", port=2022).hosts == (("fay", "10.1.2.3", 2022),)


def test_a_bad_port_in_ssh_config_is_a_config_error(tmp_path, monkeypatch):
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text("Host gpu1\n  Port none\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ConfigError) as caught:
        SSH(["gpu1"])
    assert caught.value.parameter == "hosts" and "~/.ssh/config" in caught.value.detail


def test_a_missing_paramiko_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "paramiko", None)  # import paramiko -> ImportError
    with pytest.raises(ImportError, match=r"pip install 'skyward\[ssh\]'"):
        SSH(["h"])


def test_a_pool_needs_one_node_per_host():
    with pytest.raises(ConfigError) as caught:
        sky.ComputePool(provider=SSH(["h1", "h2"]), nodes=3, console=False)
    assert caught.value.parameter == "nodes"


def test_importing_skyward_and_the_ssh_provider_does_not_import_paramiko():
    code = ("import sys, skyward, skyward.providers.ssh, skyward.transport.ssh; "
            "print('paramiko' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_an_identity_file_in_ssh_config_is_the_hosts_key(tmp_path, monkeypatch):
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "lab_key").write_text("not read here")
    (tmp_path / ".ssh" / "config").write_text(
        "Host gpu1\n  HostName 10.1.2.3\n  IdentityFile ~/.ssh/missing\n  IdentityFile ~/.ssh/lab_key\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    from skyward.providers.base import PoolSpec

    ssh = SSH(["gpu1", "other"], user="u")
    assert ssh.keys == (str(tmp_path / ".ssh" / "lab_key"), None)
    instances = ssh.provision(PoolSpec("p", 2))
    assert [i.ssh.key for i in instances] == [str(tmp_path / ".ssh" / "lab_key"), None]
    given = tmp_path / "given_key"
    given.write_text("x")
    assert SSH(["gpu1"], user="u", key=given).keys == (str(given),)  # key= wins over the config


def test_identity_files_in_ssh_config_that_do_not_exist_are_skipped_as_ssh_does(tmp_path, monkeypatch):
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text("Host *\n  IdentityFile ~/.ssh/gone\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert SSH(["gpu1"], user="u").keys == (None,)  # then the agent's keys and ~/.ssh/id_*


def test_a_proxy_jump_chain_in_ssh_config_is_followed_hop_by_hop(tmp_path, monkeypatch):
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text(
        "Host gpu1\n  HostName 10.1.2.3\n  ProxyJump outer,carol@inner:2200\n\n"
        "Host outer\n  HostName 203.0.113.9\n  User dave\n\nHost direct\n  ProxyJump none\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    ssh = SSH(["gpu1", "direct"], user="u")
    inner = ssh.jumps[0]
    assert inner is not None and (inner.host, inner.user, inner.port) == ("inner", "carol", 2200)
    assert inner.jump is not None and (inner.jump.host, inner.jump.user, inner.jump.port) == ("203.0.113.9", "dave", 22)
    assert inner.jump.jump is None and ssh.jumps[1] is None
