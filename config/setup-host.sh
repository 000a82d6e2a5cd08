#!/usr/bin/env bash
# Install the system packages fleet needs and make sure a Docker daemon answers. Idempotent.
# Used by `make install` and CI. Needs root (or sudo) for apt-get and dockerd.
set -euo pipefail
# chromium and chromium-driver: the status pages' browser tests (headless, driven by selenium)
packages=(python3-venv redis-server docker.io busybox-static debootstrap file iproute2 openssl systemd chromium chromium-driver)
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
  echo "setup-host: '$*' needs root; run as root or install: ${packages[*]}" >&2; return 1; fi; }

missing=()
for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  if ! command -v apt-get >/dev/null; then
    echo "setup-host: no apt-get here; install ${missing[*]} with your package manager" >&2; exit 1
  fi
  echo "setup-host: installing ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# the packaged redis-server service is not needed: fleet and its tests spawn their own
as_root systemctl disable --now redis-server >/dev/null 2>&1 || true

if ! docker info >/dev/null 2>&1; then
  if command -v systemctl >/dev/null && systemctl is-system-running >/dev/null 2>&1; then
    as_root systemctl start docker || true
  fi
  if ! docker info >/dev/null 2>&1; then
    echo "setup-host: starting dockerd (log: /var/log/fleet-dockerd.log)"
    # a session of its own: the daemon outlives the shell (and its process group) that started it
    as_root sh -c 'setsid -f dockerd </dev/null >>/var/log/fleet-dockerd.log 2>&1'
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  fi
fi
docker info >/dev/null 2>&1 && echo "setup-host: docker daemon answers" \
  || echo "setup-host: no Docker daemon; fleet will use the process runtime" >&2
