#!/usr/bin/env bash
# localhost/fleet/rootfs-bookworm: Debian bookworm minbase + python3, made with debootstrap and `docker import`
# (no container registry needed, only Debian's package mirror). Base of the framework images.
set -euo pipefail
tag=${1:-localhost/fleet/rootfs-bookworm:latest}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
root=$(mktemp -d /var/tmp/fleet-rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$root" "$mirror"
chroot "$root" apt-get clean
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/usr/share/doc/* "$root"/usr/share/man/*
tar -C "$root" -c . | docker import -c 'ENV LANG=C.UTF-8 PYTHONUNBUFFERED=1' -c 'CMD ["python3"]' - "$tag" >/dev/null
echo "built $tag"
