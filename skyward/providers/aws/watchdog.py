"""The dead man's switch every EC2 instance of a pool boots with, rendered as user data.

An instance must stop billing even when the client that launched it dies without a word
(SIGKILL, a laptop lid closed, a lost network). Instances of an ordinary pool are launched with
``InstanceInitiatedShutdownBehavior=terminate``, so powering off from inside the machine
terminates it; those of a named cluster with ``stop`` (see :func:`power_off_policy`), so it
stops and keeps its disk. This module renders what powers it off:

1. **Idle watchdog.** A small bash loop (:func:`watchdog_script`) run by a systemd service.
   Every ``interval`` seconds it looks for an established TCP connection to the SSH port
   (read from ``/proc/net/tcp*``, so it needs no extra tool); while there is one — the
   client's connection, which carries every command and every worker's byte stream — it
   touches a heartbeat file. Anything else may touch that file too, to keep the machine: a
   named cluster's resident workers do while a client is attached and until their autostop
   (:mod:`skyward.worker.resident`), so the cluster outlives its client.
   When the file is older than ``idle_timeout`` seconds the machine powers off.
2. **sshd keepalives** (``ClientAliveInterval``) so a client that vanished without closing
   its connection (network loss) drops that connection within about a minute instead of
   keeping it "established" for hours.
3. **Hard lifetime.** ``shutdown -h +N`` is armed in cloud-init's earliest stage (``bootcmd``)
   and the loop also powers off once ``/proc/uptime`` passes ``max_lifetime``, whatever the
   heartbeat says.

:func:`user_data` wraps it in a ``#cloud-config`` document (Ubuntu and the Deep Learning AMIs
run cloud-init), optionally with the pool's pre-generated SSH host key so the client can
verify the host it connects to. Both functions are pure: no I/O, same input -> same text.
The document is JSON, which is valid YAML, so no YAML quoting rules are involved.
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass, field

from skyward.errors import ConfigError

__all__ = [
    "HEARTBEAT_FILE",
    "SERVICE_NAME",
    "HostKey",
    "power_off_policy",
    "user_data",
    "watchdog_script",
]

#: The file whose modification time is the machine's heartbeat.
HEARTBEAT_FILE = "/var/lib/skyward/heartbeat"
#: The systemd unit that runs the watchdog loop.
SERVICE_NAME = "skyward-watchdog.service"
_SCRIPT_PATH = "/usr/local/sbin/skyward-watchdog"
_SSHD_DROPIN = "/etc/ssh/sshd_config.d/60-skyward-keepalive.conf"
# cloud-init's user data limit is EC2's: 16 KiB before base64.
_USER_DATA_LIMIT = 16 * 1024


@dataclass(frozen=True, slots=True)
class HostKey:
    """An SSH host key pair (OpenSSH text). ``private`` is a secret: ``repr`` leaves it out."""

    kind: str  # cloud-init's name: "ed25519", "ecdsa" or "rsa"
    public: str  # "ssh-ed25519 AAAA..."
    private: str = field(repr=False)


def power_off_policy(*, cluster: bool, down: bool, max_lifetime: float | None,
                     max_lifetime_given: bool) -> tuple[str, float | None]:
    """What powering off does to an instance (EC2's ``InstanceInitiatedShutdownBehavior``) and
    its hard lifetime, as ``(behavior, max_lifetime)``.

    An ordinary pool: ``"terminate"``, and ``max_lifetime`` as configured (default 24 h). A
    named cluster (``cluster``) outlives its client: its autostop powers it off, which
    ``"stop"``s it (disk and environments kept for ``skyward start``), or ``"terminate"``s it
    when the autostop is a teardown (``down``); it has no hard lifetime unless one was given.
    (One-time spot instances cannot stop: :func:`~skyward.providers.aws.ec2.run_instances_request`
    keeps ``"terminate"`` for them.)
    """
    if not cluster:
        return "terminate", max_lifetime
    return ("terminate" if down else "stop"), (max_lifetime if max_lifetime_given else None)


def _seconds(name: str, value: float, minimum: float) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= minimum:
        raise ConfigError(name, f"a number of seconds >= {minimum:g}", value)
    return int(math.ceil(value))


def watchdog_script(
    *,
    idle_timeout: float,
    max_lifetime: float | None,
    ssh_port: int = 22,
    heartbeat: str = HEARTBEAT_FILE,
    interval: float = 15.0,
) -> str:
    """The watchdog loop as a bash script.

    Guarantees: it never exits while the machine should run; it calls ``shutdown -h now``
    once the heartbeat file is ``idle_timeout`` seconds old or the machine has been up for
    ``max_lifetime`` seconds (``None``: no limit), and exits after a successful shutdown call.
    An established connection to ``ssh_port`` counts as a heartbeat. ``interval`` may be
    fractional (GNU sleep).
    """
    idle = _seconds("idle_timeout", idle_timeout, 1)
    lifetime = 0 if max_lifetime is None else _seconds("max_lifetime", max_lifetime, 1)
    if isinstance(ssh_port, bool) or not isinstance(ssh_port, int) or not 1 <= ssh_port <= 65535:
        raise ConfigError("ssh_port", "an integer between 1 and 65535", ssh_port)
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not interval > 0:
        raise ConfigError("interval", "a positive number of seconds", interval)
    hb = shlex.quote(heartbeat)
    # /proc/net/tcp lists "local_address rem_address st": local port in hex, st 01 = ESTABLISHED.
    port_hex = f"{ssh_port:04X}"
    return f"""#!/bin/bash
# skyward watchdog: power off (and so terminate) an instance nobody uses any more.
# idle_timeout={idle}s max_lifetime={lifetime or 'none'}{'s' if lifetime else ''} ssh_port={ssh_port}
set -u
HEARTBEAT={hb}
IDLE={idle}
LIFETIME={lifetime}
INTERVAL={interval:g}

# The idle countdown starts when the file is first made (first boot), not at each restart.
mkdir -p "$(dirname "$HEARTBEAT")"
[ -e "$HEARTBEAT" ] || touch "$HEARTBEAT"
chmod 0666 "$HEARTBEAT" 2>/dev/null || true

ssh_in_use() {{
    for table in /proc/net/tcp /proc/net/tcp6; do
        [ -r "$table" ] || continue
        if awk 'NR > 1 && $4 == "01" && toupper($2) ~ /:{port_hex}$/ {{ found = 1 }} END {{ exit !found }}' "$table"; then
            return 0
        fi
    done
    return 1
}}

power_off() {{
    echo "skyward-watchdog: $1; powering off"
    if shutdown -h now; then exit 0; fi
    systemctl poweroff --force || poweroff -f
    exit 0
}}

while true; do
    if ssh_in_use; then
        touch "$HEARTBEAT"
    fi
    now=$(date +%s)
    last=$(stat -c %Y "$HEARTBEAT" 2>/dev/null || echo "$now")
    # Whole seconds on both sides: only a difference above IDLE proves IDLE seconds passed.
    if [ $((now - last)) -gt "$IDLE" ]; then
        power_off "no heartbeat for $((now - last))s (idle_timeout ${{IDLE}}s)"
    fi
    if [ "$LIFETIME" -gt 0 ]; then
        up=$(cut -d. -f1 /proc/uptime)
        if [ "$up" -ge "$LIFETIME" ]; then
            power_off "up for ${{up}}s (max_lifetime ${{LIFETIME}}s)"
        fi
    fi
    sleep "$INTERVAL"
done
"""


def _service_unit() -> str:
    return f"""[Unit]
Description=skyward watchdog (powers off an idle or expired instance)
After=network.target

[Service]
Type=simple
ExecStart={_SCRIPT_PATH}
Restart=always
RestartSec=5

[Install]
WantedBy=multi-user.target
"""


def user_data(
    *,
    idle_timeout: float,
    max_lifetime: float | None,
    host_key: HostKey | None = None,
    ssh_port: int = 22,
) -> str:
    """The ``#cloud-config`` user data for one instance of a pool.

    It installs and starts the watchdog service, adds sshd keepalives, arms ``shutdown -h``
    at ``max_lifetime`` from the earliest boot stage, and — with ``host_key`` — replaces the
    generated SSH host keys with the pool's own so the client can verify the machine.

    The text holds ``host_key.private``: pass it to EC2 only, never log it. Raises
    :class:`~skyward.errors.ConfigError` if it would exceed EC2's 16 KiB limit.
    """
    script = watchdog_script(idle_timeout=idle_timeout, max_lifetime=max_lifetime, ssh_port=ssh_port)
    config: dict[str, object] = {}
    if max_lifetime is not None:
        minutes = max(1, int(math.ceil(max_lifetime / 60)))
        # bootcmd runs before anything else; a failure later in boot cannot disarm this.
        config["bootcmd"] = [["shutdown", "-h", f"+{minutes}", "skyward: max_lifetime reached"]]
    if host_key is not None:
        config["ssh_deletekeys"] = True
        config["ssh_keys"] = {
            f"{host_key.kind}_private": host_key.private,
            f"{host_key.kind}_public": host_key.public,
        }
    config["write_files"] = [
        {"path": _SCRIPT_PATH, "permissions": "0755", "owner": "root:root", "content": script},
        {"path": f"/etc/systemd/system/{SERVICE_NAME}", "permissions": "0644", "content": _service_unit()},
        {"path": _SSHD_DROPIN, "permissions": "0644",
         "content": "ClientAliveInterval 15\nClientAliveCountMax 4\n"},
    ]
    config["runcmd"] = [
        ["systemctl", "daemon-reload"],
        ["systemctl", "enable", "--now", SERVICE_NAME],
        # Ubuntu names the unit ssh, others sshd; reload picks up the keepalive drop-in.
        ["sh", "-c", "systemctl reload ssh 2>/dev/null || systemctl reload sshd 2>/dev/null || true"],
    ]
    text = "#cloud-config\n" + json.dumps(config, indent=1, sort_keys=False) + "\n"
    if len(text.encode()) > _USER_DATA_LIMIT:
        raise ConfigError("user_data", f"at most {_USER_DATA_LIMIT} bytes", f"{len(text.encode())} bytes")
    return text
