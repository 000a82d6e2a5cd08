#!/usr/bin/env bash
# localhost/fleet/busybox: a ~2 MB image from the host's busybox-static, for the test suite. No registry.
set -euo pipefail
tag=${1:-localhost/fleet/busybox:latest}
busybox=$(command -v busybox)
file -L "$busybox" 2>/dev/null | grep -q "statically linked" || ldd "$busybox" 2>&1 | grep -q "not a dynamic" \
  || { echo "busybox at $busybox is not static: apt-get install busybox-static" >&2; exit 1; }
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/bin" "$root/tmp" "$root/etc"
cp "$busybox" "$root/bin/busybox"
for app in $("$busybox" --list); do [ "$app" = busybox ] || ln -sf busybox "$root/bin/$app"; done
echo "root:x:0:0:root:/root:/bin/sh" > "$root/etc/passwd"
tar -C "$root" -c . | docker import -c 'ENV PATH=/bin' -c 'CMD ["/bin/sh"]' - "$tag" >/dev/null
echo "built $tag"
