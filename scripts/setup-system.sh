#!/usr/bin/env bash
# Installs the Debian packages trialbox needs, only those that are missing.
#   python3  — the default sandbox runtime (/usr/bin/python3 + stdlib), never the venv
#   gcc g++  — C/C++ programs compiled and run inside the sandbox
#   bubblewrap — the isolation baseline `trialbox bench sandbox` measures against
#   python3-pytest — the test runner of repository tasks, inside the sandbox runtime
#   (and the isolation tiers' runtimes, below)
set -euo pipefail
need=()
[ -x /usr/bin/python3 ] || need+=(python3)
[ -x /usr/bin/gcc ] || need+=(gcc)
[ -x /usr/bin/g++ ] || need+=(g++)
[ -x /usr/bin/bwrap ] || need+=(bubblewrap)
#   chromium — the headless browser the dashboard's end-to-end test drives (Playwright
#              cannot download its own here)
[ -x /usr/bin/chromium ] || need+=(chromium)
[ -f /usr/lib/python3/dist-packages/pytest/__init__.py ] || need+=(python3-pytest)
#   runsc — gVisor, the user-space-kernel tier (ptrace platform); runc, crun — the OCI
#           container tier; user-mode-linux — a real Linux 6.1 kernel as a process, to
#           test the namespace tier on cgroup v2 (this host's cgroup v2 has no controllers)
[ -x /usr/bin/runsc ] || need+=(runsc)
[ -x /usr/sbin/runc ] || need+=(runc)
[ -x /usr/bin/crun ] || need+=(crun)
[ -x /usr/bin/linux ] || need+=(user-mode-linux)
#   zstd — compresses saved session snapshots (trialbox/sandbox/snapshot_archive.py)
[ -x /usr/bin/zstd ] || need+=(zstd)
#   prometheus — its `promtool test rules` checks the shipped alert rules
#                (trialbox/telemetry/alerts.yml) in tests/telemetry/test_alerts.py
[ -x /usr/bin/promtool ] || need+=(prometheus)
#   nftables, iproute2 — network allow-lists (Limits.net_allow): the gateway namespace's
#           filter and counter (nft), the veth pair and routes (ip)
[ -x /usr/sbin/nft ] || need+=(nftables)
[ -x /usr/sbin/ip ] || need+=(iproute2)
#   the languages of `trialbox serve`'s SandboxFusion-compatible /run_code beyond C/C++/
#   Python/bash (trialbox/sandbox/languages.py declares what each needs): Java 17 + JUnit 4,
#   Go, Rust, Node.js + TypeScript (Debian's nodejs, or any already at /usr/bin/node)
[ -x /usr/bin/javac ] || need+=(default-jdk-headless)
[ -f /usr/share/java/junit4.jar ] || need+=(junit4)
[ -x /usr/bin/go ] || need+=(golang-go)
[ -x /usr/bin/rustc ] || need+=(rustc)
[ -x /usr/bin/node ] || need+=(nodejs)
[ -x /usr/bin/tsc ] || need+=(node-typescript)
#   debootstrap — builds environment images (trialbox image build: a Debian root)
[ -x /usr/sbin/debootstrap ] || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "setup-system: missing Debian packages: ${need[*]} — run as root or: sudo apt-get install ${need[*]}" >&2
    exit 1
  fi
  echo "setup-system: installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
# user-mode-linux must also boot on this CPU: Debian 12's 6.1 cannot on hosts with
# AVX-512/AMX XSAVE areas; scripts/setup-uml.sh probes it and fetches a newer one there.
"$(cd "$(dirname "$0")" && pwd)/setup-uml.sh" >/dev/null
# jest (the JavaScript test runner) and TypeScript's Node typings are not installable
# from Debian 12 (node-jest-worker needs a node-types-node the archive lacks, and
# node-typescript 4.8 ships no Node typings): npm installs the versions pinned in
# scripts/js/package-lock.json under /usr/local/lib/trialbox-js (inside /usr, which the
# sandbox mounts read-only), only when missing or when the lock changed.
JS=/usr/local/lib/trialbox-js
here="$(cd "$(dirname "$0")" && pwd)"
if [ ! -x "$JS/node_modules/.bin/jest" ] || ! cmp -s "$here/js/package-lock.json" "$JS/package-lock.json"; then
  if [ "$(id -u)" != 0 ]; then
    echo "setup-system: jest missing — run as root to install it under $JS" >&2
    exit 1
  fi
  command -v npm >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm >/dev/null; }
  mkdir -p "$JS"
  cp "$here/js/package.json" "$here/js/package-lock.json" "$JS/"
  echo "setup-system: installing jest under $JS"
  (cd "$JS" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi
