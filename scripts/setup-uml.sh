#!/usr/bin/env bash
# Makes sure a user-mode-linux kernel that boots on THIS host is at hand for
# scripts/uml-pytest.sh (the namespace tier's suites on cgroup v2, tests/sandbox/
# test_cgroup_v2.py), and prints its path.
#
# Debian 12's user-mode-linux (6.1, /usr/bin/linux) is tried first: a trivial init must
# print a line and power off. It cannot boot on a host whose CPU has a large XSAVE area
# (AVX-512 and AMX, e.g. a Sapphire Rapids Xeon): since Linux 5.14 the host kernel's
# PTRACE_SETREGSET(NT_X86_XSTATE) wants the whole XSAVE buffer, UML 6.1 (and 6.12)
# passes a fixed 832-byte one, and the guest's init dies at once ("userspace - ptrace
# set fp regs failed, errno = 14", a kernel panic). Newer UML sizes it from the host.
# So when the probe fails, this takes Debian's newest user-mode-linux (and the C library
# it is built against) from the archive with apt — unpacked under /opt/trialbox-uml,
# never installed over the system's — points its ELF interpreter at that C library
# (patchelf), and probes it the same way.
#
#   scripts/setup-uml.sh            # prints the kernel binary to use; exit 1 if none boots
#
# Needs root the first time (apt, /opt). The result is cached: /opt/trialbox-uml/linux.
set -euo pipefail
OPT=/opt/trialbox-uml
SUITE="${UML_SUITE:-sid}"

probe() {  # $1: a UML binary; boots it with an init that echoes and powers off
  local bin="$1" work
  work="$(mktemp -d /tmp/trialbox-uml-probe.XXXXXX)"
  printf '#!/bin/sh\necho uml-probe-ok\n/sbin/poweroff -f\n' > "$work/init"
  chmod +x "$work/init"
  timeout 120 "$bin" mem=256M root=/dev/root rootfstype=hostfs rootflags=/ ro \
    "init=$work/init" con=null con0=null,fd:2 > "$work/console" 2>&1 || true
  local ok=1
  grep -q uml-probe-ok "$work/console" && ok=0
  if [ $ok != 0 ]; then
    grep -m1 -E "fp regs failed|Kernel panic|error" "$work/console" >&2 || true
  fi
  rm -rf "$work"
  return $ok
}

if [ -x "$OPT/linux" ] && probe "$OPT/linux" 2>/dev/null; then
  echo "$OPT/linux"; exit 0
fi
if [ -x /usr/bin/linux ] && probe /usr/bin/linux 2>/dev/null; then
  echo /usr/bin/linux; exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "setup-uml: Debian 12's user-mode-linux does not boot on this CPU; run" \
       "scripts/setup-uml.sh as root once to fetch a newer one under $OPT" >&2
  exit 1
fi
echo "setup-uml: /usr/bin/linux (UML 6.1) does not boot on this CPU (its XSAVE area:" \
     "$(grep -m1 -o 'avx512f\|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')); fetching" \
     "Debian $SUITE's user-mode-linux under $OPT" >&2
command -v patchelf >/dev/null || {
  apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq patchelf >/dev/null; }
state="$(mktemp -d /tmp/trialbox-uml-apt.XXXXXX)"
trap 'rm -rf "$state"' EXIT
mkdir -p "$state/lists/partial" "$state/cache/archives/partial" "$state/debs"
# The Debian mirror this machine's apt already uses (its own sources; no host is named
# here), or TRIALBOX_DEBIAN_MIRROR.
mirror="${TRIALBOX_DEBIAN_MIRROR:-$(sed -n -E \
  -e 's/^[[:space:]]*URIs:[[:space:]]+([^[:space:]]+).*/\1/p' \
  -e 's/^[[:space:]]*deb([[:space:]]+\[[^]]*\])?[[:space:]]+([^[:space:]]+).*/\2/p' \
  /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources \
  2>/dev/null | grep -E '/debian/?$' | head -n1)}"
if [ -z "$mirror" ]; then
  echo "setup-uml: no Debian mirror in this machine's apt sources; set" \
       "TRIALBOX_DEBIAN_MIRROR to one (e.g. the URI of your apt source for $SUITE)" >&2
  exit 1
fi
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]" \
     "${mirror%/} $SUITE main" > "$state/sources.list"
A=(-o "Dir::Etc::SourceList=$state/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
   -o "Dir::State::Lists=$state/lists" -o "Dir::Cache=$state/cache"
   -o "APT::Sandbox::User=root")
apt-get "${A[@]}" update -qq
(cd "$state/debs" && apt-get "${A[@]}" download -qq user-mode-linux libc6 >/dev/null)
version="$(dpkg-deb -f "$state"/debs/user-mode-linux_*.deb Version)"
dest="$OPT/$version"
rm -rf "$dest"
mkdir -p "$dest/root"
for deb in "$state"/debs/*.deb; do dpkg-deb -x "$deb" "$dest/root"; done
lib="$dest/root/usr/lib/x86_64-linux-gnu"
cp "$dest/root/usr/bin/linux.uml" "$dest/linux"
patchelf --set-interpreter "$lib/ld-linux-x86-64.so.2" --set-rpath "$lib" "$dest/linux"
if ! probe "$dest/linux"; then
  echo "setup-uml: Debian $SUITE's user-mode-linux $version does not boot here either" >&2
  exit 1
fi
# The guest loads its modules (ipv6) from /usr/lib/uml/modules/<release> through hostfs.
for m in "$dest"/root/usr/lib/uml/modules/*; do
  [ -e "/usr/lib/uml/modules/$(basename "$m")" ] || {
    mkdir -p /usr/lib/uml/modules; ln -s "$m" "/usr/lib/uml/modules/$(basename "$m")"; }
done
ln -sfn "$dest/linux" "$OPT/linux"
echo "setup-uml: user-mode-linux $version ready at $OPT/linux" >&2
echo "$OPT/linux"
