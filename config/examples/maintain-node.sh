#!/usr/bin/env bash
# Take a node out for maintenance and bring it back:
#   drain (jobs may finish for $DEADLINE, then checkpoint and move) -> wait -> maintain -> uncordon.
# Usage: maintain-node.sh NODE COMMAND...    e.g. maintain-node.sh gpu-07 ssh gpu-07 sudo apt-get -y upgrade
# Env:   DEADLINE (default 30m), GRACE (default 60s), TIMEOUT (default 2h), FLEET_REDIS_URL.
set -euo pipefail
node=$1; shift
fleet drain "$node" --deadline "${DEADLINE:-30m}" --grace "${GRACE:-60s}" --reason "maintenance: $*" \
  --wait --timeout "${TIMEOUT:-2h}"
"$@"                     # the maintenance itself; on failure the node stays DRAINED for a human
fleet uncordon "$node"
fleet nodes show "$node"
