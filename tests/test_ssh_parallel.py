"""An SSH pool reaches its hosts at once, not one after another, and a host's preparation
ends without a second command (real sshd test hosts).

Each host is reached through a ProxyCommand (``~/.ssh/config``) that holds its connection
until every host's connection has begun: a pool that connected one host at a time would wait
on the first forever (its connect times out), whatever the machine's speed. The pool's own
log lines then show every host's connect interval overlapping every other's.
"""

from __future__ import annotations

import sys

import skyward as sky
from skyward import events as ev

#: The ProxyCommand: marks its host arrived in the gate folder, waits until every host has,
#: then carries the connection to the host's sshd.
GATE = """\
import os, socket, sys, threading, time
gate, count, host = sys.argv[1], int(sys.argv[2]), sys.argv[3]
open(os.path.join(gate, host), "w").close()
while len(os.listdir(gate)) < count:
    time.sleep(0.01)
s = socket.create_connection((host, 22))
def up():
    while data := os.read(0, 65536):
        s.sendall(data)
    s.shutdown(socket.SHUT_WR)
threading.Thread(target=up, daemon=True).start()
while data := s.recv(65536):
    os.write(1, data)
"""


@sky.compute
def hostname() -> str:
    import socket

    return socket.gethostname()


def test_an_ssh_pool_connects_to_its_hosts_at_once(test_hosts, wheelhouse, tmp_path, monkeypatch):
    hosts = test_hosts
    gate = tmp_path / "gate"
    gate.mkdir()
    (tmp_path / "gate.py").write_text(GATE)
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text("".join(
        f"Host gated{i}\n  HostName {h.ip}\n  ProxyCommand {sys.executable} {tmp_path / 'gate.py'} {gate} "
        f"{len(hosts)} %h\n" for i, h in enumerate(hosts)))
    monkeypatch.setenv("HOME", str(tmp_path))
    provider = sky.SSH([f"gated{i}" for i in range(len(hosts))], user=hosts[0].user, key=hosts[0].key_path,
                       known_hosts=hosts[0].known_hosts_all, find_links=[wheelhouse], no_index=True,
                       connect_timeout=30)  # (a loaded machine starts the gates slowly)
    logs: list[tuple[int, str]] = []

    def seen(event: ev.Event) -> None:
        if isinstance(event, ev.NodeLog):
            logs.append((event.node, event.line))

    with sky.ComputePool(provider=provider, nodes=len(hosts), image=sky.Image(env={"GATED": "1"}),
                         console=False, on_event=seen, start_timeout=120) as pool:
        assert sorted(hostname() @ pool) == sorted(h.name for h in hosts)
    assert sorted(p.name for p in gate.iterdir()) == sorted(h.ip for h in hosts)
    # Every host's connect began (its "connecting" line) before any host's connect ended.
    order = [(node, line.split()[0]) for node, line in logs if line.split()[0] in ("connecting", "connected")]
    began = [k for k, (_, word) in enumerate(order) if word == "connecting"]
    ended = [k for k, (_, word) in enumerate(order) if word == "connected"]
    assert len(began) == len(ended) == len(hosts)
    assert max(began) < min(ended), order


def test_a_streamed_command_gives_its_exit_code_and_leaves_nothing_of_its_group(test_hosts):
    # A process left in the background holds the command's output open: the group ends it,
    # with the switch, as it reports the exit code (once the stream waited for it to end).
    from skyward.transport.ssh import SSHTransport

    host = test_hosts[0]
    transport = SSHTransport(host.ip, port=host.port, user=host.user, key_filename=host.key_path,
                             known_hosts=[host.known_hosts], connect_timeout=5)
    lines: list[tuple[str, str]] = []
    try:
        code = transport.stream("sleep 4343 & echo started; (exit 3)", lambda s, line: lines.append((s, line)),
                                timeout=20)
        assert (code, lines) == (3, [("stdout", "started")])
        assert host.processes(r"^sleep 4343") == []
    finally:
        transport.close()
