# shellcheck shell=bash
# Sourced by the benchmark scripts (scripts/bench.sh, bench/*.sh): a scratch
# folder, the processes started (stopped by their pid on exit) and free
# loopback ports.
#
#   source bench/procs.sh
#   procs_init rl-bench                 # WORK=/tmp/rl-bench.XXXXXX, PIDS=(), trap on EXIT
#   p=$(free_port); server --port "$p" & PIDS+=($!); wait_port "$p" 10
procs_init() {
  WORK=$(mktemp -d "/tmp/$1.XXXXXX")
  PIDS=()
  trap procs_cleanup EXIT
}
procs_cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
free_port() {
  local p
  for _ in $(seq 200); do
    # Below the kernel's ephemeral range (32768-60999): a port there may be the
    # local end of some outgoing connection, and nginx's bind() then fails.
    p=$((20000 + RANDOM % 12000))
    if ! ss -Htan "sport = :$p" 2>/dev/null | grep -q .; then echo "$p"; return 0; fi
  done
  return 1
}
wait_port() {  # port, seconds
  local i
  for ((i = 0; i < $2 * 20; i++)); do
    if ss -Htln "sport = :$1" 2>/dev/null | grep -q .; then return 0; fi
    sleep 0.05
  done
  return 1
}
