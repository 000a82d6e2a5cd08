#!/usr/bin/env bash
# Slurm beside fleet (bench/scale.py's real-agent throughput): N trivial batch jobs on one node of 16
# (fake) CPUs, first `sbatch` -> last job done, with Slurm's default scheduler settings and tuned ones.
#
# Optional: without Slurm it says so and exits 0. `--install` installs Debian's slurm-wlm (root).
# Everything runs from a temp dir: its own munged socket, slurm.conf, spool and state; the daemons
# are started here (no systemd) and stopped on exit. Run: bash bench/slurm.sh [--install] [--jobs N]
# `--sbatch-rate N` only times N `sbatch --wrap true` calls one after another (bench/api.py puts that
# beside fleet's submits through its API) and prints `sbatch_per_s=<rate>`.
# `--run CMD...` starts Slurm (tuned settings, below) and runs CMD with SLURM_CONF set, then stops it
# (bench/functions.py runs submitit there).
set -euo pipefail

JOBS=1000
INSTALL=0
RATE=0
RUN=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --install) INSTALL=1 ;;
    --jobs) JOBS=$2; shift ;;
    --sbatch-rate) RATE=$2; shift ;;
    --run) shift; RUN=("$@"); break ;;
    *) echo "usage: $0 [--install] [--jobs N] [--sbatch-rate N] [--run CMD...]" >&2; exit 2 ;;
  esac
  shift
done

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  if [[ $INSTALL == 1 ]]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm >/dev/null
  else
    echo "slurm not installed: skipped (bash bench/slurm.sh --install installs Debian's slurm-wlm)"
    exit 0
  fi
fi

ROOT=$(mktemp -d /tmp/fleet-bench-slurm-XXXXXX)
HOST=$(hostname -s)
PIDS=()  # slurmctld and slurmd of the current run: children of this shell
stop_slurm() {
  if [[ ${#PIDS[@]} -gt 0 ]]; then
    kill "${PIDS[@]}" 2>/dev/null || true
    wait "${PIDS[@]}" 2>/dev/null || true
  fi
  PIDS=()
}
cleanup() {
  stop_slurm
  [[ -S $ROOT/munge/socket ]] && munged --stop --socket="$ROOT/munge/socket" >/dev/null 2>&1 || true
}
trap cleanup EXIT

start_munge() {
  dd if=/dev/urandom of="$ROOT/munge.key" bs=1024 count=1 status=none
  chmod 0400 "$ROOT/munge.key"
  mkdir -p -m 0700 "$ROOT/munge"
  munged --force --key-file="$ROOT/munge.key" --socket="$ROOT/munge/socket" \
    --pid-file="$ROOT/munge/pid" --log-file="$ROOT/munge/log" --seed-file="$ROOT/munge/seed"
}

write_conf() {  # $1: extra lines
  mkdir -p "$ROOT/state" "$ROOT/spool"
  cat >"$ROOT/slurm.conf" <<EOF
ClusterName=fleetbench
SlurmctldHost=$HOST
AuthType=auth/munge
AuthInfo=socket=$ROOT/munge/socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$ROOT/state
SlurmdSpoolDir=$ROOT/spool
SlurmctldPidFile=$ROOT/slurmctld.pid
SlurmdPidFile=$ROOT/slurmd.pid
SlurmctldLogFile=$ROOT/slurmctld.log
SlurmdLogFile=$ROOT/slurmd.log
SlurmctldPort=$((20000 + RANDOM % 20000))
SlurmdPort=$((40000 + RANDOM % 20000))
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MaxJobCount=100000
NodeName=$HOST CPUs=16 RealMemory=1000 State=UNKNOWN
PartitionName=bench Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
$1
EOF
}

now() { date +%s.%N; }

start_slurm() {  # $1: extra slurm.conf lines; fails when the node never becomes idle
  rm -rf "$ROOT/state" "$ROOT/spool"
  write_conf "$1"
  export SLURM_CONF=$ROOT/slurm.conf
  slurmctld -i -D >/dev/null 2>&1 & PIDS+=($!)
  slurmd -D >/dev/null 2>&1 & PIDS+=($!)
  for _ in $(seq 100); do
    sinfo -h -o %T 2>/dev/null | grep -qE '^idle' && break
    sleep 0.2
  done
  sinfo -h -o %T | grep -qE '^idle'
}

sbatch_rate() {  # $1: calls
  start_slurm "" || { echo "node never became idle (see $ROOT/*.log)"; return 1; }
  local first last
  first=$(now)
  for _ in $(seq "$1"); do sbatch -Q -o /dev/null -e /dev/null --wrap true; done
  last=$(now)
  python3 -c "import sys; print(f'sbatch_per_s={int(sys.argv[1]) / (float(sys.argv[3]) - float(sys.argv[2])):.1f}')" \
    "$1" "$first" "$last"
  stop_slurm
}

run() {  # $1: label, $2: extra slurm.conf lines
  start_slurm "$2" || { echo "| $1 | node never became idle (see $ROOT/*.log) |"; return; }
  local first last
  first=$(now)
  for _ in $(seq "$JOBS"); do sbatch -Q -o /dev/null -e /dev/null --wrap true; done
  local submitted
  submitted=$(now)
  while [[ -n $(squeue -h -o %i) ]]; do sleep 0.1; done
  last=$(now)
  python3 - "$1" "$JOBS" "$first" "$submitted" "$last" <<'EOF'
import sys
label, jobs, first, submitted, last = sys.argv[1], int(sys.argv[2]), *map(float, sys.argv[3:])
print(f"| {label} | {jobs} | {last - first:.1f} s | **{jobs / (last - first):.1f} jobs/s** "
      f"| submitting took {submitted - first:.1f} s |", flush=True)
EOF
  stop_slurm
}

TUNED="SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,default_queue_depth=1000"
start_munge
if [[ ${#RUN[@]} -gt 0 ]]; then
  start_slurm "$TUNED" || { echo "node never became idle (see $ROOT/*.log)"; exit 1; }
  status=0
  "${RUN[@]}" || status=$?
  stop_slurm
  exit $status
fi
if [[ $RATE -gt 0 ]]; then
  sbatch_rate "$RATE"
  exit
fi
echo "# slurm $(slurmctld -V | awk '{print $2}'), $(date +%F), $HOST: $(nproc) cores; one node of 16 CPUs; logs in $ROOT"
echo "| Slurm settings | jobs | first sbatch -> last done | throughput | notes |"
echo "|---|---|---|---|---|"
run "default" ""
run "tuned: batch_sched_delay=0, sched_min_interval=0, default_queue_depth=1000" "$TUNED"
