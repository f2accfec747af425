#!/usr/bin/env bash
# Install the system packages the SSH test-host harness (tests/hosts/testhosts.py)
# and the Slurm test cluster (tests/slurm_cluster.py, with its accounting database) need. Idempotent: only missing packages are installed, and `apt-get update`
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
    # (tests/test_bootstrap.py counts the programs a warm bootstrap starts)
    "strace:strace"
    # (tests/test_dashboard.py: a real headless browser and its WebDriver)
    "chromium:chromium"
    "chromium-driver:chromedriver"
    # A real Slurm for tests/test_slurm.py (tests/slurm_cluster.py runs its own daemons).
    "slurmctld:slurmctld"
    "slurmd:slurmd"
    "slurm-client:sbatch srun salloc squeue scancel scontrol sinfo"
    "munge:munged"
    # Slurm's accounting database for tests/test_slurm_accounts.py (accounts and QOS): slurmdbd
    # stores only in MySQL/MariaDB; the cluster fixture runs its own mariadbd, not the service.
    "slurmdbd:slurmdbd"
    "mariadb-server:mariadbd mariadb-install-db"
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
# Wait at most LOCK_WAIT seconds for a dpkg/apt lock another process holds (a boot-time
# unattended-upgrades run, another apt-get) instead of forever, then say so.
LOCK_WAIT=${APT_LOCK_TIMEOUT:-300}
apt() {
    local log rc
    log=$(mktemp)
    set +e
    apt-get -o DPkg::Lock::Timeout="$LOCK_WAIT" "$@" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    set -e
    if [ "$rc" -ne 0 ] && grep -qiE "could not get lock|unable to acquire the dpkg|unable to lock" "$log"; then
        holder=$( (fuser /var/lib/dpkg/lock-frontend /var/lib/dpkg/lock /var/lib/apt/lists/lock 2>/dev/null \
                   | xargs -r ps -o pid=,comm= -p) 2>/dev/null || true)
        echo "install-deps.sh: apt-get $1 gave up after ${LOCK_WAIT}s waiting for the dpkg lock," \
             "held by another package manager${holder:+: $holder}. Wait for it to finish (or stop it)" \
             "and run this again; APT_LOCK_TIMEOUT=<seconds> waits longer." >&2
    fi
    rm -f "$log"
    return "$rc"
}
apt update -q
apt install -y -q --no-install-recommends "${missing[@]}"
echo "install-deps.sh: done"
