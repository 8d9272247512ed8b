#!/usr/bin/env bash
# Runs pytest inside user-mode-linux: a real Linux 6.1 kernel (Debian 12's line) booted as
# an ordinary process, with cgroup v2 (cpu, io, memory, pids controllers) mounted at
# /sys/fs/cgroup, the host's files read-only through hostfs, tmpfs on /tmp and /run.
# This host's own cgroup v2 mount holds no controllers, so this is how the namespace
# tier's cgroup v2 driver is tested for real (tests/sandbox/test_cgroup_v2.py).
#
#   scripts/uml-pytest.sh tests/sandbox/test_statuses.py -q      # any pytest arguments
#
# Exit status: pytest's inside the guest; 125 when the guest did not report one (it
# did not boot, or was killed by UML_TIMEOUT seconds, default 1500).
# In the guest TRIALBOX_EXPECT_CGROUP=2 and TRIALBOX_TEST_TIME_SCALE (default 10: the
# sandbox suites' default time limits x10) are set.
# Needs /usr/bin/linux (Debian's user-mode-linux; scripts/setup-system.sh installs it, and
# scripts/setup-uml.sh a newer one where 6.1 cannot boot on the host's CPU).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
python="${UML_PYTHON:-$repo/.venv/bin/python}"
mem="${UML_MEM:-3072M}"
if [ ! -x /usr/bin/linux ]; then
  echo "uml-pytest: /usr/bin/linux is missing: apt-get install user-mode-linux" \
       "(scripts/setup-system.sh does)" >&2
  exit 2
fi
# Debian 12's UML 6.1 where it boots; on a CPU it cannot run on (AVX-512/AMX XSAVE
# areas), the newer one scripts/setup-uml.sh fetched (it says why, and probes both).
linux="${UML_LINUX:-$("$repo/scripts/setup-uml.sh")}" || {
  echo "uml-pytest: no user-mode-linux boots on this host (scripts/setup-uml.sh)" >&2
  exit 2; }
work="$(mktemp -d /tmp/trialbox-uml.XXXXXX)"
trap 'rm -rf "$work"' EXIT
mkdir "$work/out"
args="$(printf '%q ' "$@")"  # quoted for the guest's shell, written into its init
# The guest's init: mount what a booted Debian would, then run pytest as root. (The
# host's /tmp is hidden under the guest's own tmpfs: nothing is read from $work inside.)
cat > "$work/init" <<INIT
#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t tmpfs run /run
# A checkout (or interpreter) under the host's /tmp would vanish under the guest's own
# /tmp: keep it, bound back in place.
case "$repo/ $python" in *"/tmp/"*) mkdir -p /run/keep-tmp && mount --bind /tmp /run/keep-tmp ;; esac
mount -t tmpfs tmp /tmp
for p in $repo $(dirname "$(dirname "$python")"); do
  case "\$p" in /tmp/*) mkdir -p "\$p" && mount --bind "/run/keep-tmp/\${p#/tmp/}" "\$p" ;; esac
done
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t devtmpfs dev /dev 2>/dev/null
ln -s /proc/self/fd /dev/fd; ln -s fd/0 /dev/stdin; ln -s fd/1 /dev/stdout; ln -s fd/2 /dev/stderr
mkdir -p /dev/shm /dev/pts && mount -t tmpfs shm /dev/shm && mount -t devpts pts /dev/pts
mkdir -p /tmp/out && mount -t hostfs none /tmp/out -o $work/out
# Debian 12 boots with IPv6; this UML kernel builds it as a module
m=/usr/lib/uml/modules/\$(uname -r)/kernel
ipv6="\$(insmod \$m/lib/crc-ccitt.ko 2>&1; insmod \$m/net/ipv6/ipv6.ko 2>&1)"
# and overlayfs, which every cell's root is made of (docs/sandbox.md)
insmod \$m/fs/overlayfs/overlay.ko 2>/dev/null
ip link set lo up 2>/dev/null
export HOME=/tmp PYTHONDONTWRITEBYTECODE=1 LANG=C.UTF-8 TRIALBOX_EXPECT_CGROUP=2
export TRIALBOX_TEST_TIME_SCALE=${TRIALBOX_TEST_TIME_SCALE:-10}
export PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin
cd $repo
echo "guest: \$(uname -r), cgroup2 controllers: \$(cat /sys/fs/cgroup/cgroup.controllers)\${ipv6:+, ipv6: \$ipv6}" > /tmp/out/log
$python -m pytest -p no:cacheprovider $args >> /tmp/out/log 2>&1
echo \$? > /tmp/out/status
sync
/sbin/poweroff -f
INIT
chmod +x "$work/init"
timeout "${UML_TIMEOUT:-1500}" "$linux" "mem=$mem" root=/dev/root rootfstype=hostfs \
  rootflags=/ ro "init=$work/init" con=null con0=null,fd:2 > "$work/console" 2>&1 || true
cat "$work/out/log" 2>/dev/null || true
if [ ! -s "$work/out/status" ]; then
  echo "uml-pytest: the guest reported no result; its console's end:" >&2
  tail -20 "$work/console" >&2
  exit 125
fi
exit "$(cat "$work/out/status")"
