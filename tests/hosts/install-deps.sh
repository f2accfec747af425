#!/usr/bin/env bash
# Install the system packages the SSH test-host harness (tests/hosts/testhosts.py)
# needs. Idempotent: only missing packages are installed, and `apt-get update`
# runs once, only when something is missing. Run as root on Debian/Ubuntu.
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps.sh: must run as root" >&2
    exit 1
fi

have() {  # have CMD: CMD is on PATH or in a usual sbin/bin dir
    command -v "$1" >/dev/null 2>&1 && return 0
    local d
    for d in /usr/sbin /sbin /usr/bin /bin; do
        [ -x "$d/$1" ] && return 0
    done
    return 1
}

# "package:command command ..." — the package is needed if any command is missing
needs=(
    "openssh-server:sshd"
    "openssh-client:ssh ssh-keygen"
    "iproute2:ip"
    "util-linux:unshare nsenter setsid"
    "mount:mount"
    "procps:pgrep ps"
    "hostname:hostname"
)

missing=()
for entry in "${needs[@]}"; do
    pkg=${entry%%:*}
    for cmd in ${entry#*:}; do
        if ! have "$cmd"; then
            missing+=("$pkg")
            break
        fi
    done
done

if [ "${#missing[@]}" -eq 0 ]; then
    echo "install-deps.sh: all dependencies present"
    exit 0
fi

echo "install-deps.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# Keep the package's own sshd service from being started on install where the
# system honours policy-rc.d (harmless either way: the harness runs its own).
if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "install-deps.sh: done"
