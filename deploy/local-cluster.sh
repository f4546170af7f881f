#!/usr/bin/env bash
# A real cluster-mode Litz job on one machine: etcd, a master, workers and a server, each a separate
# process talking over TCP on 127.0.0.1 and registered in etcd, exactly as on several machines.
#
#   deploy/local-cluster.sh             apps.mlr on synthetic data with 2 workers and 1 server
#   deploy/local-cluster.sh --elastic   also: a third worker (--id extra-worker) joins while the job runs
#                                       and is then drained with `litzctl drain`, as a Kubernetes preStop
#                                       hook would do on `kubectl scale --replicas` down
#
# Environment: LITZ_APP (default apps.mlr), LITZ_CONFIG (default "synthetic=1", "synthetic=1 epochs=60 tol=0"
# with --elastic), WORKERS (2), SERVERS (1), ETCD_BIN (etcd on $PATH), KEEP=1 keeps the temporary
# directory with the logs. Needs `pip install -e ".[apps]"` and an etcd binary (apt-get install etcd-server).
# With openssl, etcd serves TLS with client certificates, as in the other deployments (see below).
# Every process it starts is stopped when it exits, also on an error or Ctrl-C.
set -euo pipefail

ELASTIC=0
case "${1:-}" in
    --elastic) ELASTIC=1 ;;
    "") ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "usage: $0 [--elastic]" >&2; exit 2 ;;
esac

cd "$(dirname "$0")/.."                      # the repository root: apps.mlr resolves from here
APP=${LITZ_APP:-apps.mlr}
if [ "$ELASTIC" = 1 ]; then CONFIG=${LITZ_CONFIG:-synthetic=1 epochs=60 tol=0}; else CONFIG=${LITZ_CONFIG:-synthetic=1}; fi
WORKERS=${WORKERS:-2}
SERVERS=${SERVERS:-1}
ETCD_BIN=${ETCD_BIN:-etcd}
JOB=local-cluster-$$
HOST=127.0.0.1

for cmd in "$ETCD_BIN" litz litzctl python3; do
    command -v "$cmd" >/dev/null || { echo "local-cluster: $cmd not found on PATH" >&2; exit 2; }
done

TMP=$(mktemp -d "${TMPDIR:-/tmp}/litz-local-cluster.XXXXXX")
PIDS=()          # the litz processes this script started, stopped by id on exit
ETCD_PID=
STATUS=1

stop_all() {     # stop_all PID...: TERM, up to 10 s to exit, then KILL
    local pid
    for pid in "$@"; do kill -TERM "$pid" 2>/dev/null || true; done
    for _ in $(seq 100); do
        local alive=0
        for pid in "$@"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        [ "$alive" = 0 ] && return 0
        sleep 0.1
    done
    for pid in "$@"; do kill -KILL "$pid" 2>/dev/null || true; done
}

cleanup() {
    set +e
    trap - EXIT INT TERM
    [ ${#PIDS[@]} -gt 0 ] && stop_all "${PIDS[@]}"
    [ -n "$ETCD_PID" ] && stop_all "$ETCD_PID"     # last: the others unregister from it on their way out
    wait 2>/dev/null || true
    if [ "$STATUS" != 0 ] && [ "$STATUS" != 130 ]; then
        echo "local-cluster: FAILED; logs:" >&2
        for f in "$TMP"/*.log; do [ -s "$f" ] && { echo "--- $f" >&2; tail -n 20 "$f" >&2; }; done
    fi
    if [ "${KEEP:-0}" = 1 ] || [ "$STATUS" != 0 ]; then
        echo "local-cluster: logs kept in $TMP" >&2
    else
        rm -rf "$TMP"
    fi
    exit "$STATUS"
}
trap cleanup EXIT
trap 'echo "local-cluster: interrupted" >&2; STATUS=130; exit 130' INT TERM

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
fail() { echo "local-cluster: $*" >&2; STATUS=1; exit 1; }
step() { echo "[local-cluster $(date +%T)] $*"; }

# -- etcd: a temporary single-member cluster on free ports -----------------------------------------------
# 127.0.0.1 is not private: every user of this machine can connect to it. The master publishes the job
# secret in etcd, and whoever can read etcd can join the job (send pickles that its processes unpickle) and
# steer it. So etcd serves only TLS and accepts only clients with the certificate that make-etcd-certs.sh
# puts in $TMP, which only you can read. Without openssl, etcd runs without TLS and the script says so.
# That is acceptable only on a machine nobody else uses.
CLIENT_PORT=$(free_port)
PEER_PORT=$(free_port)
ETCD=$HOST:$CLIENT_PORT
ETCD_OPTS=(--etcd "$ETCD")                   # how every litz and litzctl below reaches etcd
if command -v openssl >/dev/null; then
    bash deploy/make-etcd-certs.sh "$TMP/tls" >/dev/null || fail "deploy/make-etcd-certs.sh failed"
    SCHEME=https
    ETCD_TLS=(--cert-file "$TMP/tls/server.crt" --key-file "$TMP/tls/server.key" --client-cert-auth --trusted-ca-file "$TMP/tls/ca.crt")
    ETCD_OPTS+=(--etcd-cacert "$TMP/tls/ca.crt" --etcd-cert "$TMP/tls/client.crt" --etcd-key "$TMP/tls/client.key")
else
    SCHEME=http
    ETCD_TLS=()
    echo "local-cluster: openssl not found: etcd without TLS, and any user of this machine can join the job" >&2
fi
step "etcd on $SCHEME://$ETCD (data in $TMP/etcd)"
"$ETCD_BIN" --name litz-local --data-dir "$TMP/etcd" \
    --listen-client-urls "$SCHEME://$ETCD" --advertise-client-urls "$SCHEME://$ETCD" "${ETCD_TLS[@]}" \
    --listen-peer-urls "http://$HOST:$PEER_PORT" --initial-advertise-peer-urls "http://$HOST:$PEER_PORT" \
    --initial-cluster "litz-local=http://$HOST:$PEER_PORT" >"$TMP/etcd.log" 2>&1 &
ETCD_PID=$!
# litzctl waits up to --etcd-timeout for etcd, and with TLS checks the certificates on the way
litzctl "${ETCD_OPTS[@]}" --etcd-timeout 20 list >/dev/null 2>"$TMP/etcd-wait.log" \
    || fail "etcd did not become healthy (see $TMP/etcd.log and $TMP/etcd-wait.log)"

# -- the job: master first (it publishes the job secret), then servers and workers in any order ------------
step "master: litz master $APP --config $CONFIG (job $JOB)"
# shellcheck disable=SC2086  # CONFIG is a list of key=value words
litz master "$APP" "${ETCD_OPTS[@]}" --name "$JOB" --host "$HOST" --config $CONFIG \
    --min-workers "$WORKERS" --min-servers "$SERVERS" --output "$TMP/result.json" --no-progress \
    >"$TMP/master.out" 2>"$TMP/master.log" &
MASTER_PID=$!
PIDS+=("$MASTER_PID")

ROLE_PIDS=()
start_role() {   # start_role worker|server [litz options...]
    local role=$1 n=${#ROLE_PIDS[@]}
    shift
    litz "$role" "${ETCD_OPTS[@]}" --name "$JOB" --host "$HOST" "$@" >"$TMP/$role-$n.log" 2>&1 &
    PIDS+=("$!")
    ROLE_PIDS+=("$!")
}
for _ in $(seq "$SERVERS"); do start_role server; done
for _ in $(seq "$WORKERS"); do start_role worker; done
step "started $SERVERS server(s) and $WORKERS worker(s)"

ctl() { litzctl "${ETCD_OPTS[@]}" --name "$JOB" "$@"; }

# -- watch it: the master publishes its status once the job has started ----------------------------------
for _ in $(seq 300); do
    if ctl status >"$TMP/status.txt" 2>/dev/null; then break; fi
    kill -0 "$MASTER_PID" 2>/dev/null || break
    sleep 0.1
done
if [ -s "$TMP/status.txt" ]; then
    step "litzctl status"
    cat "$TMP/status.txt"
else
    kill -0 "$MASTER_PID" 2>/dev/null && fail "no status from the master within 30 s"
    step "the job ended before its first status"
fi

if [ "$ELASTIC" = 1 ]; then
    kill -0 "$MASTER_PID" 2>/dev/null || fail "the job ended before the elastic test; use a longer LITZ_CONFIG"
    step "scale out: a worker with --id extra-worker joins"
    litz worker "${ETCD_OPTS[@]}" --name "$JOB" --host "$HOST" --id extra-worker >"$TMP/worker-extra.log" 2>&1 &
    EXTRA_PID=$!
    PIDS+=("$EXTRA_PID")
    got=0
    for _ in $(seq 300); do                  # until it holds executors
        if ctl status --json 2>/dev/null | python3 -c '
import json, sys
try:
    st = json.load(sys.stdin)
except ValueError:
    sys.exit(1)
sys.exit(0 if any(w["id"] == "extra-worker" and w["executors"] for w in st["workers"]) else 1)'; then
            got=1; break
        fi
        kill -0 "$MASTER_PID" 2>/dev/null || fail "the master exited while extra-worker was joining"
        sleep 0.1
    done
    [ "$got" = 1 ] || fail "extra-worker received no executors within 30 s"
    ctl status
    step "scale in: litzctl drain extra-worker --timeout 60 (what a preStop hook runs)"
    ctl drain extra-worker --timeout 60 || fail "drain failed"
    wait "$EXTRA_PID" || fail "the drained worker exited with status $?"
    step "extra-worker exited cleanly"
    ctl status
fi

# -- the end: the master's exit status, its result, and every role gone ---------------------------------
step "waiting for the master"
rc=0
wait "$MASTER_PID" || rc=$?
[ "$rc" = 0 ] || fail "the master exited with status $rc"
step "result: $(cat "$TMP/master.out")"
python3 - "$TMP/result.json" <<'EOF' || fail "bad $TMP/result.json"
import json, sys
out = json.load(open(sys.argv[1]))
assert out["state"] == "finished" and out["result"] is not None, out
print(f"[local-cluster] {out['tasks_completed']} tasks in {out['elapsed_s']:.1f} s; "
      f"events: {', '.join(e['kind'] for e in out.get('events', [])) or 'none'}")
EOF
for pid in "${ROLE_PIDS[@]}"; do         # the master tells every worker and server to exit
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && fail "process $pid still running 10 s after the job ended"
    wait "$pid" || fail "a worker or server exited with status $?"
done
step "OK: every process exited cleanly"
STATUS=0
