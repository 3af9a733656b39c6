#!/usr/bin/env bash
# Where the Redis path's latency tail comes from: one ratelimitd (decision
# API, Redis store, one I/O thread) under a fixed rate of POST /v1/check, with
# Redis' latency monitor on, then what Redis and the daemon saw.
#
#   bench/redis-tail.sh BUILD_DIR [RATE] [SECONDS] [RATELIMITD]
#
# Starts its own redis-server (Redis' defaults, plus latency-monitor-threshold
# 1 ms and slowlog-log-slower-than 1 ms) and ratelimitd on free loopback ports,
# drives them with BUILD_DIR/http_load (open loop, 64 connections, 100,000
# keys), and prints: http_load's line (p50/p99/p99.9 from each request's due
# time); Redis' LATENCY LATEST and expired_keys; calls and checks per call
# (INFO commandstats); SLOWLOG entries; the daemon's per-stage histograms
# (ratelimit_stage_seconds, ratelimit_redis_*_seconds) from /metrics, as
# bucket counts. Bounded: SECONDS (default 5) plus a few seconds of start-up.
# Every process started here is stopped by its pid on exit.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=$(cd "${1:?usage: bench/redis-tail.sh BUILD_DIR [RATE] [SECONDS] [RATELIMITD]}" && pwd)
RATE=${2:-20000}
SECS=${3:-5}
RLD=${4:-$B/ratelimitd}
# KEYS: distinct client keys (100,000: each seen every few seconds, so none
# expires); WARM_SECS: load before the measured run (1); REDIS_EXTRA: more
# redis-server arguments (e.g. "--hz 100"). Steady expiry, as when clients come
# and go: KEYS=400000 WARM_SECS=12 at 15000/s (each key comes back after 12 s,
# and its TTL floor is 10-15 s: about 15,000 expire a second).
KEYS=${KEYS:-100000}
WARM_SECS=${WARM_SECS:-1}
[[ -x $RLD && -x $B/http_load ]] || { echo "redis-tail.sh: need $RLD and $B/http_load" >&2; exit 2; }

# shellcheck source=bench/procs.sh
source "$ROOT/bench/procs.sh"
procs_init rl-redis-tail
up() { wait_port "$1" 10 || { echo "redis-tail.sh: nothing listens on $1" >&2; exit 1; }; }

RP=$(free_port)
redis-server --port "$RP" --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK" \
  --latency-monitor-threshold 1 --slowlog-log-slower-than 1000 ${REDIS_EXTRA:-} --daemonize no >"$WORK/redis.log" 2>&1 &
PIDS+=($!)
up "$RP"
rcli() { redis-cli -p "$RP" "$@"; }

LP=$(free_port); AP=$(free_port)
"$RLD" --config "$ROOT/bench/configs/decision-memory.yaml" --listen "127.0.0.1:$LP" \
  --admin-listen "127.0.0.1:$AP" --redis "redis://127.0.0.1:$RP" >"$WORK/rld.log" 2>&1 &
PIDS+=($!)
up "$LP"
up "$AP"

# Warm-up (keys in Redis, script loaded), then reset what is counted.
"$B/http_load" --port="$LP" --kind=check --rate="$RATE" --connections=64 --keys="$KEYS" \
  --duration-ms=$((WARM_SECS * 1000)) --warmup-ms=0 >/dev/null || true
rcli CONFIG RESETSTAT >/dev/null
rcli LATENCY RESET >/dev/null
rcli SLOWLOG RESET >/dev/null
curl -s "http://127.0.0.1:$AP/metrics" >"$WORK/m0.txt"

"$B/http_load" --port="$LP" --kind=check --rate="$RATE" --connections=64 --keys="$KEYS" \
  --duration-ms=$((SECS * 1000)) --warmup-ms=0 || true
curl -s "http://127.0.0.1:$AP/metrics" >"$WORK/m1.txt"

echo "redis: expired_keys $(rcli INFO stats | tr -d '\r' | sed -n 's/^expired_keys://p') in ${SECS}s"
calls=$(rcli INFO commandstats | tr -d '\r' | sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\),.*/\1/p')
sets=$(rcli INFO commandstats | tr -d '\r' | sed -n 's/^cmdstat_set:calls=\([0-9]*\),.*/\1/p')
echo "redis: evalsha calls ${calls:-0}, SETs ${sets:-0} (checks per call $(awk -v a="${sets:-0}" -v b="${calls:-0}" 'BEGIN { if (b) printf "%.1f", a/b; else print "n/a" }'))"
echo "redis: LATENCY LATEST (event, time, latest ms, max ms):"
rcli LATENCY LATEST | paste - - - - | sed 's/^/  /'
echo "redis: SLOWLOG entries over 1 ms: $(rcli SLOWLOG LEN)"
rcli SLOWLOG GET 5 | tr '\n' ' ' | cut -c1-600
echo
# Histogram deltas over the measured run: "name{labels} le count" per bucket.
echo "daemon: per-stage histograms over the run (bucket upper bound: requests in it):"
awk 'FNR == NR { if ($1 ~ /_bucket/) a[$1] = $2; next }
     $1 ~ /^ratelimit_(stage|redis_[a-z_]*)_seconds_bucket/ { d = $2 - a[$1]; print "  " $1 " " d }' \
  "$WORK/m0.txt" "$WORK/m1.txt" |
  awk '{ split($1, p, "{"); name = p[1] "{" substr(p[2], 1, index(p[2], "le=") - 1)
         le = $1; sub(/.*le="/, "", le); sub(/".*/, "", le)
         if (name != last) { if (last != "") print line; line = name " "; last = name; prev = 0 }
         line = line le ":" ($2 - prev) " "; prev = $2 }
       END { if (last != "") print line }'
