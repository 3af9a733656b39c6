#!/usr/bin/env bash
# Soak: ratelimitd on a real redis-server for SOAK_MINUTES (default 10) at
# about half of its measured capacity, with a churn of unique keys (about a
# million over the run), while Redis is restarted twice and frozen once
# (SIGSTOP 3 s) in the middle and the daemon reloads its config (SIGHUP)
# every minute. Every SAMPLE_SECONDS it records the daemon's RSS, open file
# descriptors and threads, Redis used_memory and the daemon's latency (p50,
# p99 of the last interval's requests), then writes
#   bench/results/soak.md    the table and the verdict
#   bench/results/soak.png   the plot (gnuplot)
# and exits non-zero if RSS, fds or threads grew by 5% or more from the end of
# the warm-up (the first 20% of the run) to the end, or if any request went
# unanswered (http_load's errors: a failed or malformed exchange).
#
#   make soak                    # 10 minutes
#   SOAK_MINUTES=2 make soak     # a quick check that it works
#
# Load: bench/macro/http_load (open loop, POST /v1/check on a token bucket),
# run in consecutive SAMPLE_SECONDS slices, each on keys of its own
# (--key-prefix), so every key is new to Redis and to the daemon. Loopback
# only; everything it starts is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

MINUTES=${SOAK_MINUTES:-10}
SAMPLE=${SAMPLE_SECONDS:-5}
B=${BUILD_DIR:-build}
OUT=${SOAK_OUT:-bench/results}
TOTAL_KEYS=${SOAK_KEYS:-1000000}
W=$(mktemp -d /tmp/rl-soak-XXXXXX)
REDIS_PID= DAEMON_PID=

fail() { echo "soak: $*" >&2; exit 1; }
cleanup() {
  [[ -n "$DAEMON_PID" ]] && kill -9 "$DAEMON_PID" 2>/dev/null || true
  [[ -f "$W/redis.pid" ]] && kill -9 "$(cat "$W/redis.pid")" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$W"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null ||
  shuf -i 20000-60000 -n 1; }

command -v redis-server >/dev/null || fail "redis-server not found"
command -v gnuplot >/dev/null || fail "gnuplot not found (scripts/install-deps.sh installs gnuplot-nox)"
if [[ ! -f "$B/build.ninja" ]]; then
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRL_BUILD_BENCH=ON >/dev/null
elif ! grep -q '^RL_BUILD_BENCH:BOOL=ON' "$B/CMakeCache.txt"; then
  cmake "$B" -DRL_BUILD_BENCH=ON >/dev/null
fi
ninja -C "$B" ratelimitd http_load >/dev/null
LOAD=$B/http_load

RPORT=$(free_port)
DPORT=$(free_port)
start_redis() {
  redis-server --port "$RPORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$W" \
    --daemonize no >>"$W/redis.log" 2>&1 &
  echo $! >"$W/redis.pid"
  for _ in $(seq 200); do redis-cli -p "$RPORT" PING >/dev/null 2>&1 && return; sleep 0.05; done
  fail "redis-server did not start: $(tail -5 "$W/redis.log")"
}
redis_pid() { cat "$W/redis.pid"; }

cat >"$W/ratelimitd.yaml" <<EOF
store:
  type: redis
  url: "redis://127.0.0.1:$RPORT"
  deadline: 100ms
  failure_mode: open
EOF
start_redis
./"$B"/ratelimitd --config "$W/ratelimitd.yaml" --listen "127.0.0.1:$DPORT" 2>"$W/daemon.log" &
DAEMON_PID=$!
for _ in $(seq 200); do
  curl -sf -o /dev/null -X POST "http://127.0.0.1:$DPORT/v1/check" -H 'Content-Type: application/json' \
    -d '{"key":"up","limits":[{"name":"b","algorithm":"token_bucket","capacity":10,"refill_per_second":5}]}' &&
    break
  sleep 0.05
done
kill -0 "$DAEMON_PID" 2>/dev/null || fail "ratelimitd did not start: $(tail -5 "$W/daemon.log")"

field() { sed -n "s/.*\b$1=\([0-9.]*\).*/\1/p" <<<"$2"; }

# Capacity: closed loop, 3 s, 32 connections.
cap_line=$("$LOAD" --port="$DPORT" --kind=check --rate=0 --connections=32 --duration-ms=3000 \
  --warmup-ms=500 --keys=50000 --key-prefix=cap- 2>&1 || true)
CAPACITY=$(field rate "$cap_line")
[[ -n "$CAPACITY" ]] || fail "capacity run failed: $cap_line"
RATE=$(awk -v c="$CAPACITY" 'BEGIN { printf "%d", c / 2 }')
SLICES=$(( MINUTES * 60 / SAMPLE ))
KEYS_PER_SLICE=$(( (TOTAL_KEYS + SLICES - 1) / SLICES ))
echo "soak: capacity ${CAPACITY}/s, load ${RATE}/s for ${MINUTES} min in ${SLICES} slices of ${SAMPLE} s"

# Events, by slice: Redis restarted at 35% and 65%, frozen 3 s at 50%;
# SIGHUP in the slice where each minute begins. Each starts 1 s into its slice.
R1=$(( SLICES * 35 / 100 )); FZ=$(( SLICES / 2 )); R2=$(( SLICES * 65 / 100 ))
restart_redis() { kill -9 "$(redis_pid)"; sleep 0.2; start_redis; }

START=$(date +%s)
printf 't_s\trss_kb\tfds\tthreads\tredis_used_memory\tp50_us\tp99_us\trequests\terrors\tdegraded\tnever_sent\tevent\n' >"$W/samples.tsv"
for (( i = 0; i < SLICES; i++ )); do
  event="" events=()
  if (( i == R1 || i == R2 )); then
    event="redis-restart"; ( sleep 1; restart_redis ) & events+=($!)
  elif (( i == FZ )); then
    event="redis-sigstop-3s"
    ( sleep 1; kill -STOP "$(redis_pid)"; sleep 3; kill -CONT "$(redis_pid)" ) & events+=($!)
  fi
  if (( i > 0 && (i * SAMPLE) % 60 < SAMPLE )); then
    event="${event:+$event+}sighup"; ( sleep 2; kill -HUP "$DAEMON_PID" ) & events+=($!)
  fi
  line=$("$LOAD" --port="$DPORT" --kind=check --rate="$RATE" --connections=16 \
    --duration-ms=$(( SAMPLE * 1000 )) --warmup-ms=0 --keys="$KEYS_PER_SLICE" --key-prefix="s$i-" 2>&1 || true)
  (( ${#events[@]} == 0 )) || wait "${events[@]}"
  kill -0 "$DAEMON_PID" 2>/dev/null || fail "ratelimitd died: $(tail -20 "$W/daemon.log")"
  [[ -n "$(field requests "$line")" ]] || fail "http_load failed: $line"
  rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/$DAEMON_PID/status")
  threads=$(awk '/^Threads:/ { print $2 }' "/proc/$DAEMON_PID/status")
  fds=$(ls "/proc/$DAEMON_PID/fd" | wc -l)
  mem=$(redis-cli -p "$RPORT" INFO memory 2>/dev/null | tr -d '\r' | sed -n 's/^used_memory://p')
  printf '%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' $(( $(date +%s) - START )) "$rss" "$fds" \
    "$threads" "${mem:-0}" "$(field p50_us "$line")" "$(field p99_us "$line")" \
    "$(field requests "$line")" "$(field errors "$line")" "$(field degraded "$line")" \
    "$(field never_sent "$line")" "${event:--}" >>"$W/samples.tsv"
  tail -1 "$W/samples.tsv"
done

# Verdict: growth from the end of the warm-up (20%) to the end, unanswered requests.
verdict=$(awk -F'\t' -v warm=$(( SLICES / 5 )) -v per="$KEYS_PER_SLICE" '
  NR == 1 { next }
  { n++; req += $8; err += $9; deg += $10; ns += $11; keys += $8 < per ? $8 : per }
  n == warm + 1 { r0 = $2; f0 = $3; t0 = $4 }
  { r1 = $2; f1 = $3; t1 = $4 }
  function g(a, b) { return (b - a) * 100.0 / a }
  END {
    ok = g(r0, r1) < 5 && g(f0, f1) < 5 && g(t0, t1) < 5 && err == 0
    printf "%s rss_growth_pct=%.1f fd_growth_pct=%.1f thread_growth_pct=%.1f requests=%d unique_keys=%d unanswered=%d degraded=%d never_sent=%d\n",
      ok ? "PASS" : "FAIL", g(r0, r1), g(f0, f1), g(t0, t1), req, keys, err, deg, ns
  }' "$W/samples.tsv")
echo "soak: $verdict"

mkdir -p "$OUT"
gnuplot <<EOF
set terminal pngcairo size 1100,1000 noenhanced
set output "$OUT/soak.png"
set datafile separator "\t"
set multiplot layout 4,1 title "ratelimitd soak: ${MINUTES} min at ${RATE}/s (half of ${CAPACITY}/s), $(date -u +%F)"
set key top left
set xlabel "seconds"
set ylabel "MiB"
plot "$W/samples.tsv" every ::1 using 1:(\$2/1024) with linespoints title "daemon RSS", \
     "" every ::1 using 1:(\$5/1048576) with linespoints title "Redis used_memory"
set ylabel "count"
plot "$W/samples.tsv" every ::1 using 1:3 with linespoints title "open fds", \
     "" every ::1 using 1:4 with linespoints title "threads"
set ylabel "microseconds"
set logscale y
plot "$W/samples.tsv" every ::1 using 1:6 with linespoints title "p50", \
     "" every ::1 using 1:7 with linespoints title "p99"
unset logscale y
set ylabel "requests"
plot "$W/samples.tsv" every ::1 using 1:10 with impulses title "degraded (failure mode answered)", \
     "" every ::1 using 1:9 with impulses title "unanswered"
unset multiplot
EOF

{
  echo "# Soak: ${MINUTES} min"
  echo
  echo "\`scripts/soak.sh\` on $(date -u '+%F %H:%M UTC'), $(nproc) cores, load average at the end:"
  echo "$(cut -d' ' -f1-3 /proc/loadavg). Capacity (closed loop, 32 connections): ${CAPACITY}/s;"
  echo "load: ${RATE}/s open loop, keys new every slice (${KEYS_PER_SLICE} per ${SAMPLE} s slice)."
  echo "Redis restarted in slices $R1 and $R2, frozen 3 s (SIGSTOP) in slice $FZ; SIGHUP every minute."
  echo
  echo "Verdict: $verdict"
  echo
  echo "| t (s) | RSS (KiB) | fds | threads | Redis used_memory | p50 (us) | p99 (us) | requests | unanswered | degraded | never sent | event |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
  tail -n +2 "$W/samples.tsv" | tr '\t' '|' | sed 's/^/|/; s/$/|/'
  echo
  echo "![soak plot](soak.png)"
} >"$OUT/soak.md"
echo "soak: wrote $OUT/soak.md and $OUT/soak.png"
[[ "$verdict" == PASS* ]]
