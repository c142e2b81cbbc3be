#!/usr/bin/env bash
# slurm-cluster.sh - a throw-away Slurm cluster on this one host, for Bursar's tests and benchmarks.
#
#   scripts/slurm-cluster.sh start [--accounting] [DIR]  start (or re-check) the cluster;
#                                                         prints SLURM_CONF last
#   scripts/slurm-cluster.sh stop  [DIR]   cancel its jobs and stop the daemons it started, by PID
#   scripts/slurm-cluster.sh status [DIR]  exit 0 if its slurmctld (and slurmdbd, if started) is up
#
# Runs as root with Debian's slurm-wlm (22.05) and munge, no systemd: one slurmctld, one
# slurmd per node (several slurmd on one host, node1..N) and a private munged with its own
# key and socket under DIR, so that it never touches /etc/munge or another cluster's daemons.
# Fake GPUs are GRES backed by symlinks to /dev/null. Everything lives under DIR (default
# ${TMPDIR:-/tmp}/bursar-slurm-cluster): config, state, logs and the PIDs of what it started.
# start is idempotent (a running cluster is only re-checked); stop kills only recorded PIDs.
# bf_interval=1: Slurm starts heterogeneous jobs (Bursar's multi-node leases with unequal
# pieces) from the backfill scheduler only, so its interval is their start latency.
#
# --accounting adds job accounting, so that `sacct` reads the cluster's jobs back: a private
# MariaDB (Debian's mariadb-server: its own datadir under DIR, a unix socket under DIR, no
# TCP), a slurmdbd on a private port storing into it, and slurm.conf pointing at that
# slurmdbd. Without it the cluster has no accounting at all and starts as fast as before.
# A fresh cluster (no slurmctld running) numbers its jobs from 1 again, so it gets a fresh
# database too.
#
# Environment (defaults in brackets):
#   SLURM_CLUSTER_NODES [4]  SLURM_CLUSTER_GPUS [8]  SLURM_CLUSTER_CPUS [32]
#   SLURM_CLUSTER_MEM_MB [128000]  SLURM_CLUSTER_PORT [16817] (slurmd ports follow it)
#   SLURM_CLUSTER_DBD_PORT [SLURM_CLUSTER_PORT + nodes + 1] (slurmdbd, with --accounting)
set -euo pipefail

usage() {
  echo "usage: $0 start [--accounting] [DIR] | stop [DIR] | status [DIR]" >&2
  exit 2
}
cmd=${1:-}
[ $# -gt 0 ] && shift
ACCOUNTING=0
if [ "$cmd" = start ] && [ "${1:-}" = --accounting ]; then
  ACCOUNTING=1
  shift
fi
case "$cmd" in start | stop | status) ;; *) usage ;; esac
[ $# -le 1 ] || usage
case "${1:-}" in -*) usage ;; esac
BASE=${1:-${SLURM_CLUSTER_DIR:-${TMPDIR:-/tmp}/bursar-slurm-cluster}}
NNODES=${SLURM_CLUSTER_NODES:-4}
GPUS=${SLURM_CLUSTER_GPUS:-8}
CPUS=${SLURM_CLUSTER_CPUS:-32}
MEM=${SLURM_CLUSTER_MEM_MB:-128000}
PORT=${SLURM_CLUSTER_PORT:-16817}
DBD_PORT=${SLURM_CLUSTER_DBD_PORT:-$((PORT + NNODES + 1))}

mkdir -p "$BASE"
BASE=$(cd "$BASE" && pwd)
ETC=$BASE/etc RUN=$BASE/run LOG=$BASE/log STATE=$BASE/state DEV=$BASE/dev
OURS=$RUN/ours
MUNGE_SOCK=$RUN/munge/munge.socket
DB_DATA=$STATE/mariadb DB_SOCK=$RUN/mariadb/mariadbd.sock
export SLURM_CONF=$ETC/slurm.conf
HOST=$(hostname -s)

log() { echo "[slurm-cluster] $*" >&2; }
die() {
  log "ERROR: $*"
  exit 1
}

# alive PIDFILE COMM: the recorded process exists, is not a zombie, and is that program
alive() {
  local pid st
  [ -s "$1" ] || return 1
  pid=$(cat "$1")
  st=$(sed 's/.*) //' /proc/"$pid"/stat 2>/dev/null | cut -d' ' -f1) || return 1
  [ -n "$st" ] && [ "$st" != Z ] || return 1
  [ "$(cat /proc/"$pid"/comm 2>/dev/null)" = "$2" ]
}

# stop_pid PIDFILE COMM: TERM, up to 15 s, then KILL; only if the PID is still that program
stop_pid() {
  local f=$1 comm=$2 pid
  if alive "$f" "$comm"; then
    pid=$(cat "$f")
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 150); do
      alive "$f" "$comm" || break
      sleep 0.1
    done
    if alive "$f" "$comm"; then kill -KILL "$pid" 2>/dev/null || true; fi
  fi
  rm -f "$f"
}

# sacctmgr talks to slurmdbd; without a bound it retries a dead one for a long while
dbd_ok() { timeout 10 sacctmgr -n -P list cluster format=cluster 2>/dev/null; }

if [ "$cmd" = status ]; then
  alive "$OURS/slurmctld.pid" slurmctld && scontrol ping >/dev/null 2>&1 || exit 1
  if [ -e "$OURS/slurmdbd.pid" ]; then
    alive "$OURS/slurmdbd.pid" slurmdbd && dbd_ok >/dev/null || exit 1
  fi
  exit 0
fi

if [ "$cmd" = stop ]; then
  if alive "$OURS/slurmctld.pid" slurmctld; then
    # Cancel this cluster's jobs while the daemons still run, so no slurmstepd outlives them.
    jobs=$(squeue -h -o %A 2>/dev/null | tr '\n' ' ' || true)
    if [ -n "${jobs// /}" ]; then
      # shellcheck disable=SC2086
      scancel $jobs 2>/dev/null || true
      for _ in $(seq 100); do
        [ -z "$(squeue -h -o %A 2>/dev/null)" ] && break
        sleep 0.1
      done
    fi
  fi
  for f in "$OURS"/slurmd-*.pid; do [ -e "$f" ] && stop_pid "$f" slurmd; done
  # slurmctld hands its last job records to slurmdbd as it stops, and slurmdbd writes them
  # into MariaDB: each stops after the one that feeds it.
  stop_pid "$OURS/slurmctld.pid" slurmctld
  stop_pid "$OURS/slurmdbd.pid" slurmdbd
  stop_pid "$OURS/mariadbd.pid" mariadbd
  # A start makes a fresh database anyway; the datadir (~150 MB) need not outlive its server.
  rm -rf "$DB_DATA"
  stop_pid "$OURS/munged.pid" munged
  log "stopped ($BASE)"
  exit 0
fi

# ------------------------------------------------------------------------------ start
for b in slurmctld slurmd sbatch salloc munged; do
  command -v "$b" >/dev/null || die "$b not found: install slurmctld slurmd slurm-client munge (scripts/system-deps.sh)"
done
if [ "$ACCOUNTING" = 1 ]; then
  for b in slurmdbd sacctmgr mariadbd mariadb-install-db mariadb-admin mariadb; do
    command -v "$b" >/dev/null || die "$b not found: install slurmdbd mariadb-server (scripts/system-deps.sh)"
  done
fi
[ "$(id -u)" = 0 ] || die "run as root (slurmd must start job steps as any user)"
mkdir -p "$ETC" "$RUN" "$OURS" "$LOG" "$STATE" "$DEV"
chmod a+x "$BASE" "$RUN" # munged runs as user munge and must reach its socket dir

start_bg() { # NAME COMM CMD...: detached, own session, PID recorded
  local name=$1 comm=$2
  shift 2
  setsid "$@" </dev/null >>"$LOG/$name.stdout" 2>&1 &
  echo $! >"$OURS/$name.pid"
  for _ in $(seq 100); do
    alive "$OURS/$name.pid" "$comm" && return 0
    sleep 0.05
  done
  tail -n 20 "$LOG/$name.stdout" >&2 || true
  die "$name did not start"
}

# -- munge: a private daemon (own key, socket, pid and seed files), run as user munge
munge_ok() { munge -S "$MUNGE_SOCK" -n 2>/dev/null | unmunge -S "$MUNGE_SOCK" >/dev/null 2>&1; }
if ! alive "$OURS/munged.pid" munged || ! munge_ok; then
  stop_pid "$OURS/munged.pid" munged
  install -d -o munge -g munge -m 0700 "$ETC/munge" "$RUN/munge" "$LOG/munge"
  chmod 0755 "$RUN/munge" # clients (root) connect to the socket
  if [ ! -s "$ETC/munge/munge.key" ]; then
    dd if=/dev/urandom of="$ETC/munge/munge.key" bs=1 count=1024 status=none
  fi
  chown munge:munge "$ETC/munge/munge.key" && chmod 0400 "$ETC/munge/munge.key"
  rm -f "$MUNGE_SOCK"
  start_bg munged munged setpriv --reuid=munge --regid=munge --init-groups \
    munged -F --force --socket="$MUNGE_SOCK" --key-file="$ETC/munge/munge.key" \
    --pid-file="$RUN/munge/munged.pid" --log-file="$LOG/munge/munged.log" \
    --seed-file="$RUN/munge/munged.seed"
  for _ in $(seq 100); do
    munge_ok && break
    sleep 0.1
  done
  munge_ok || die "munged is not answering on $MUNGE_SOCK (see $LOG/munge/munged.log)"
fi

# -- config
for ((i = 0; i < GPUS; i++)); do ln -sfn /dev/null "$DEV/nvidia$i"; done
GRES_NODE="" && [ "$GPUS" -gt 0 ] && GRES_NODE="Gres=gpu:$GPUS"
if [ "$ACCOUNTING" = 1 ]; then
  # gres/gpu is not a TRES Slurm accounts by default: listing it puts the GPUs into
  # sacct's AllocTRES and ReqTRES (what `bursar replay --format sacct-gpu` reads).
  # AccountingStoragePass is the munge socket for talking to slurmdbd (AuthInfo's is not
  # used there): the private munged's.
  ACCT_CONF="JobAcctGatherType=jobacct_gather/linux
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
AccountingStoragePass=$MUNGE_SOCK
AccountingStorageTRES=gres/gpu"
else
  ACCT_CONF="JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none"
fi
cat >"$ETC/slurm.conf.new" <<EOF
# generated by scripts/slurm-cluster.sh - single-host test cluster for Bursar
ClusterName=bursartest
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$PORT
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCK,cred_expire=30
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/slurmd-%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
$ACCT_CONF
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_interval=5,bf_interval=1
ReturnToService=2
SlurmdParameters=config_overrides
GresTypes=gpu
MailProg=/bin/true
InactiveLimit=0
KillWait=2
MinJobAge=300
MaxJobCount=20000
NodeName=node[1-$NNODES] NodeHostname=$HOST NodeAddr=127.0.0.1 Port=[$((PORT + 1))-$((PORT + NNODES))] CPUs=$CPUS RealMemory=$MEM $GRES_NODE State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
echo "AutoDetect=off" >"$ETC/gres.conf.new"
if [ "$GPUS" -gt 0 ]; then
  echo "NodeName=node[1-$NNODES] Name=gpu File=$DEV/nvidia[0-$((GPUS - 1))]" >>"$ETC/gres.conf.new"
fi
changed=0
for f in slurm.conf gres.conf; do
  if ! cmp -s "$ETC/$f.new" "$ETC/$f"; then
    changed=1
    mv "$ETC/$f.new" "$ETC/$f"
  else rm -f "$ETC/$f.new"; fi
done

# -- accounting: a private MariaDB, slurmdbd storing into it, the cluster registered there
db_ok() { mariadb-admin --no-defaults --socket="$DB_SOCK" ping >/dev/null 2>&1; }
# root over the socket: mariadb-install-db gives root@localhost unix_socket authentication
db_sql() { mariadb --no-defaults --socket="$DB_SOCK" --user=root --batch -e "$1"; }
if [ "$ACCOUNTING" = 1 ]; then
  # The same server options for the datadir's creation and every start: the sizes and
  # timeout slurmdbd asks for (it logs an error below them), and, for a throw-away
  # database, commits that do not wait for the disk.
  DB_OPTS=(--datadir="$DB_DATA" --innodb-buffer-pool-size=128M --innodb-log-file-size=64M
    --innodb-lock-wait-timeout=900 --innodb-flush-log-at-trx-commit=2)
  # A fresh cluster (no slurmctld running) numbers its jobs from 1 again, so it gets a fresh
  # database too: sacct would otherwise mix in an earlier run's jobs under the same ids.
  if ! alive "$OURS/mariadbd.pid" mariadbd || ! db_ok || ! alive "$OURS/slurmctld.pid" slurmctld; then
    stop_pid "$OURS/slurmdbd.pid" slurmdbd # it is connected to the database that goes away
    stop_pid "$OURS/mariadbd.pid" mariadbd
    rm -rf "$DB_DATA"
    install -d -o mysql -g mysql -m 0700 "$DB_DATA" "$LOG/mariadb"
    install -d -o mysql -g mysql -m 0755 "$RUN/mariadb" # clients (root) reach the socket
    if ! mariadb-install-db --no-defaults --user=mysql "${DB_OPTS[@]}" \
      --auth-root-authentication-method=socket --skip-test-db >"$LOG/mariadb/install.log" 2>&1; then
      tail -n 20 "$LOG/mariadb/install.log" >&2 || true
      die "mariadb-install-db failed (see $LOG/mariadb/install.log)"
    fi
    rm -f "$DB_SOCK"
    # --skip-networking: the socket under DIR is the only way in; no port to collide on.
    start_bg mariadbd mariadbd mariadbd --no-defaults --user=mysql "${DB_OPTS[@]}" \
      --socket="$DB_SOCK" --skip-networking --pid-file="$RUN/mariadb/mariadbd.pid" \
      --log-error="$LOG/mariadb/mariadbd.err"
    for _ in $(seq 300); do
      db_ok && break
      alive "$OURS/mariadbd.pid" mariadbd || break
      sleep 0.1
    done
    db_ok || die "mariadbd is not answering on $DB_SOCK (see $LOG/mariadb/mariadbd.err)"
    # slurmdbd's own user, with this cluster's password; it reaches only its database.
    if [ ! -s "$ETC/slurmdbd.pass" ]; then
      (umask 077 && od -An -tx1 -N16 /dev/urandom | tr -d ' \n' >"$ETC/slurmdbd.pass")
    fi
    db_sql "CREATE DATABASE slurm_acct_db;
      CREATE USER 'slurm'@'localhost' IDENTIFIED BY '$(cat "$ETC/slurmdbd.pass")';
      GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';" ||
      die "could not create slurmdbd's database and user in MariaDB"
  fi

  # slurmdbd reads slurmdbd.conf beside $SLURM_CONF and refuses one that is not mode 600
  # and owned by its SlurmUser (the file holds the database password).
  (
    umask 077
    cat >"$ETC/slurmdbd.conf.new" <<EOF
# generated by scripts/slurm-cluster.sh - accounting for the single-host test cluster
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCK
DbdHost=$HOST
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$RUN/slurmdbd.pid
LogFile=$LOG/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageLoc=slurm_acct_db
StorageUser=slurm
StoragePass=$(cat "$ETC/slurmdbd.pass")
EOF
  )
  dbd_changed=0
  if ! cmp -s "$ETC/slurmdbd.conf.new" "$ETC/slurmdbd.conf"; then
    dbd_changed=1
    mv "$ETC/slurmdbd.conf.new" "$ETC/slurmdbd.conf"
  else rm -f "$ETC/slurmdbd.conf.new"; fi
  if alive "$OURS/slurmdbd.pid" slurmdbd && dbd_ok >/dev/null; then
    [ "$dbd_changed" = 1 ] && log "slurmdbd.conf changed while slurmdbd runs: stop, then start again"
  else
    stop_pid "$OURS/slurmdbd.pid" slurmdbd
    # StorageHost=localhost makes the client library use a unix socket; Slurm passes it no
    # socket path, so the library takes the one in MYSQL_UNIX_PORT.
    start_bg slurmdbd slurmdbd env MYSQL_UNIX_PORT="$DB_SOCK" slurmdbd -D
    # A refused sacctmgr takes ~2 s, so the wait is bounded by time, not by tries.
    deadline=$((SECONDS + 60))
    while [ "$SECONDS" -lt "$deadline" ]; do
      dbd_ok >/dev/null && break
      alive "$OURS/slurmdbd.pid" slurmdbd || break
      sleep 0.2
    done
    if ! dbd_ok >/dev/null; then
      tail -n 20 "$LOG/slurmdbd.log" >&2 || true
      die "slurmdbd is not answering on port $DBD_PORT within 60 s (see $LOG/slurmdbd.log)"
    fi
  fi
  # slurmctld accounts only for a cluster the database knows.
  if ! dbd_ok | grep -qx bursartest; then
    sacctmgr -i add cluster bursartest >/dev/null || die "sacctmgr could not add cluster bursartest"
  fi
fi

# -- daemons
if alive "$OURS/slurmctld.pid" slurmctld; then
  [ "$changed" = 1 ] && log "config changed while slurmctld runs: stop, then start again"
else
  rm -rf "$STATE"/ctld "$STATE"/slurmd-* # a fresh cluster: no jobs left from a previous run
  mkdir -p "$STATE/ctld"
  start_bg slurmctld slurmctld slurmctld -D -f "$SLURM_CONF"
fi
for ((i = 1; i <= NNODES; i++)); do
  n=node$i
  mkdir -p "$STATE/slurmd-$n"
  alive "$OURS/slurmd-$n.pid" slurmd && continue
  start_bg "slurmd-$n" slurmd slurmd -D -N "$n" -f "$SLURM_CONF"
done

# -- wait until every node is usable (~0.5 s on a quiet machine)
ok=0
for _ in $(seq 300); do
  states=$(sinfo -h -N -o %T 2>/dev/null || true)
  if [ -n "$states" ] && [ "$(echo "$states" | wc -l)" -eq "$NNODES" ] &&
    ! echo "$states" | grep -qvE '^(idle|mixed|allocated)$'; then
    ok=1
    break
  fi
  sleep 0.2
done
if [ "$ok" != 1 ]; then
  tail -n 20 "$LOG/slurmctld.log" >&2 || true
  die "nodes did not become idle within 60 s"
fi
log "up: $NNODES nodes x $GPUS GPUs, $CPUS CPUs; export SLURM_CONF=$SLURM_CONF"
echo "$SLURM_CONF"
