#!/usr/bin/env bash
# The measured check of docs/scaling.md: the same load on a Redis Cluster of
# 1 master and of 3, through ratelimitd's decision API.
#
#   bench/cluster-scaling.sh BUILD_DIR [RATE] [SECONDS] [REPS]
#
# Starts two clusters (1 master holding every slot; 3 masters, slots split
# by redis-cli --cluster create) and, for comparison, one plain Redis (calls
# batched across keys, which a cluster's per-slot calls cannot be), each with
# its own ratelimitd (bench config: one I/O thread), all on free loopback ports,
# and drives each in turn (REPS interleaved runs) with BUILD_DIR/http_load at
# RATE POST /v1/check a second (open loop; RATE 0: closed loop, as many as
# they answer; 64 connections, 100,000 keys, one
# token bucket each) for SECONDS. Per run it prints one line: decisions,
# p50/p99 (us), each master's CPU time per decision (utime+stime from /proc),
# their sum, the busiest master's share, checks per script call (INFO
# commandstats), Redis network bytes per decision (INFO stats), and the
# daemon's CPU time per decision. Then the medians and the ratios 3 / 1 the
# model predicts (busiest master's CPU per decision: 1/3; total: 1).
# Bounded: (SECONDS + 1) x 3 x REPS plus start-up; everything it started is
# stopped by pid on exit.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=$(cd "${1:?usage: bench/cluster-scaling.sh BUILD_DIR [RATE] [SECONDS] [REPS]}" && pwd)
RATE=${2:-10000}
SECS=${3:-3}
REPS=${4:-3}
[[ -x $B/ratelimitd && -x $B/http_load ]] || { echo "cluster-scaling.sh: build ratelimitd and http_load in $B" >&2; exit 2; }
# shellcheck source=bench/procs.sh
source "$ROOT/bench/procs.sh"
procs_init rl-cluster-scaling
up() { wait_port "$1" 10 || { echo "cluster-scaling.sh: nothing listens on $1" >&2; exit 1; }; }
cpu_ms() { awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) * 1000 / hz }' "/proc/$1/stat"; }
stat_of() { redis-cli -p "$1" INFO "$2" | tr -d '\r'; }

declare -A MASTERS MASTER_PIDS RLD_PORT RLD_PID
cluster_port() {  # a free port P with P + 10000 (its cluster bus) free too
  local p
  for _ in $(seq 100); do
    p=$(free_port)
    if ((p + 10000 < 65536)) && ! ss -Htan "sport = :$((p + 10000))" | grep -q .; then echo "$p"; return 0; fi
  done
  return 1
}
start_cluster() {  # name masters (0: one plain Redis, not a cluster)
  local name=$1 n=$2 i p ports=() pids=() cluster=(--cluster-enabled yes --cluster-config-file nodes.conf)
  ((n == 0)) && cluster=()
  for ((i = 0; i < (n > 0 ? n : 1); i++)); do
    p=$(cluster_port)
    mkdir -p "$WORK/$name-$p"
    redis-server --port "$p" --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK/$name-$p" \
      "${cluster[@]}" --daemonize no >"$WORK/$name-$p.log" 2>&1 &
    PIDS+=($!); pids+=($!); ports+=("$p")
    up "$p"
  done
  local url="redis+cluster://" ok=1
  if ((n == 0)); then
    url="redis://"
  elif ((n == 1)); then
    redis-cli -p "${ports[0]}" CLUSTER ADDSLOTSRANGE 0 16383 >/dev/null
  else
    local addrs=()
    for p in "${ports[@]}"; do addrs+=("127.0.0.1:$p"); done
    redis-cli --cluster create "${addrs[@]}" --cluster-replicas 0 --cluster-yes >"$WORK/$name-create.log" 2>&1 ||
      { cat "$WORK/$name-create.log" >&2; exit 1; }
  fi
  for ((i = 0; i < 100 && n > 0; i++)); do
    ok=1
    for p in "${ports[@]}"; do
      redis-cli -p "$p" CLUSTER INFO | grep -q cluster_state:ok || ok=0
    done
    ((ok)) && break
    sleep 0.1
  done
  ((ok)) || { echo "cluster-scaling.sh: cluster $name not ok" >&2; exit 1; }
  MASTERS[$name]="${ports[*]}"; MASTER_PIDS[$name]="${pids[*]}"
  p=$(free_port)
  url+=$(printf '127.0.0.1:%s,' "${ports[@]}"); url=${url%,}
  "$B/ratelimitd" --config "$ROOT/bench/configs/decision-memory.yaml" --listen "127.0.0.1:$p" \
    --admin-listen "" --redis "$url" >"$WORK/rld-$name.log" 2>&1 &
  RLD_PID[$name]=$!; PIDS+=($!); RLD_PORT[$name]=$p
  up "$p"
  # Warm-up: connections made, script loaded on every master.
  "$B/http_load" --port="$p" --kind=check --rate=2000 --connections=64 --duration-ms=500 \
    --warmup-ms=0 >/dev/null
}

run() {  # name: one measured run, one key=value line
  local name=$1 p i
  local -a ports pids c0
  read -ra ports <<<"${MASTERS[$name]}"; read -ra pids <<<"${MASTER_PIDS[$name]}"
  for ((i = 0; i < ${#ports[@]}; i++)); do
    redis-cli -p "${ports[i]}" FLUSHALL >/dev/null
    redis-cli -p "${ports[i]}" CONFIG RESETSTAT >/dev/null
    c0[i]=$(cpu_ms "${pids[i]}")
  done
  local d0; d0=$(cpu_ms "${RLD_PID[$name]}")
  local out
  out=$("$B/http_load" --port="${RLD_PORT[$name]}" --kind=check --rate="$RATE" --connections=64 \
    --duration-ms=$((SECS * 1000)) --warmup-ms=500) || { echo "cluster-scaling.sh: http_load: $out" >&2; exit 1; }
  local d1; d1=$(cpu_ms "${RLD_PID[$name]}")
  # Every check of the run, warm-up included, reached Redis: count them there.
  local sum_cpu=0 max_cpu=0 calls=0 sets=0 net=0 cpu s
  for ((i = 0; i < ${#ports[@]}; i++)); do
    cpu=$(awk -v a="${c0[i]}" -v b="$(cpu_ms "${pids[i]}")" 'BEGIN { print b - a }')
    sum_cpu=$(awk -v a="$sum_cpu" -v b="$cpu" 'BEGIN { print a + b }')
    max_cpu=$(awk -v a="$max_cpu" -v b="$cpu" 'BEGIN { print (b > a ? b : a) }')
    s=$(stat_of "${ports[i]}" commandstats)
    calls=$((calls + $(sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\),.*/\1/p' <<<"$s" | head -1)))
    sets=$((sets + $(sed -n 's/^cmdstat_set:calls=\([0-9]*\),.*/\1/p' <<<"$s" | head -1)))
    s=$(stat_of "${ports[i]}" stats)
    net=$((net + $(sed -n 's/^total_net_input_bytes://p' <<<"$s") + $(sed -n 's/^total_net_output_bytes://p' <<<"$s")))
  done
  local n=$sets  # every allowed check writes its key once (the bucket never denies here)
  awk -v name="$name" -v m="${#ports[@]}" -v n="$n" -v sum="$sum_cpu" -v max="$max_cpu" \
    -v calls="$calls" -v net="$net" -v d="$(awk -v a="$d0" -v b="$d1" 'BEGIN { print b - a }')" \
    -v out="$out" 'BEGIN {
      split(out, kv, " "); for (i in kv) { split(kv[i], f, "="); v[f[1]] = f[2] }
      printf "%s masters=%d decisions=%d http_p50_us=%s http_p99_us=%s redis_cpu_us_per_decision=%.2f busiest_master_us_per_decision=%.2f busiest_share=%.2f checks_per_call=%.1f redis_net_bytes_per_decision=%.0f daemon_cpu_us_per_decision=%.2f\n",
        name, m, n, v["p50_us"], v["p99_us"], sum * 1000 / n, max * 1000 / n, (sum > 0 ? max / sum : 0),
        (calls ? n / calls : 0), net / n, d * 1000 / n }'
}

start_cluster single 0
start_cluster one 1
start_cluster three 3
for ((r = 1; r <= REPS; r++)); do
  for c in single one three; do run "$c" | tee -a "$WORK/runs.txt"; done
done
kv() { tr ' ' '\n' <<<"$2" | sed -n "s/^$1=//p"; }
median() { sort -g | awk '{a[NR]=$1} END { print (NR % 2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2) }'; }
for f in redis_cpu_us_per_decision busiest_master_us_per_decision checks_per_call redis_net_bytes_per_decision daemon_cpu_us_per_decision http_p50_us http_p99_us; do
  med() { grep "^$1 " "$WORK/runs.txt" | while read -r l; do kv "$f" "$l"; done | median; }
  awk -v f="$f" -v s="$(med single)" -v a="$(med one)" -v b="$(med three)" 'BEGIN {
    printf "median %s: plain Redis %s; cluster of 1 master %s, of 3 masters %s; ratio 3/1 %.2f\n", f, s, a, b, (a > 0 ? b / a : 0) }'
done
