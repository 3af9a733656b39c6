#!/usr/bin/env bash
# Installs what building, running and testing ratelimit needs, from Debian 12
# packages only. Idempotent: installs only what is missing. Runs as root, or
# through sudo.
#
#   scripts/install-deps.sh          build + run + test dependencies
#   scripts/install-deps.sh --build  only what building needs
set -euo pipefail

build_pkgs=(
  build-essential cmake ninja-build pkg-config git
  libboost-dev libssl-dev libhiredis-dev libyaml-cpp-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libjemalloc-dev            # ratelimitd's malloc (RL_ALLOCATOR in CMakeLists.txt)
  # The gRPC face (src/grpc): HTTP/2 from nghttp2 (the codec Envoy's own gRPC
  # client uses; bench/macro/grpc_h2_load speaks it too), messages from protobuf.
  libnghttp2-dev libprotobuf-dev protobuf-compiler
  # gRPC C++ for the tests' and the bench's clients and the bench's trivial
  # gRPC server (the peer): its CMake config, its protoc plugin.
  libgrpc++-dev protobuf-compiler-grpc
)
test_pkgs=(
  redis-server redis-tools   # the store the integration tests talk to (never mocked)
  redis-sentinel             # the Sentinel tests (tests/sentinel) start real sentinels
  gnuplot-nox                # make soak's plot
  nginx                      # auth_request and load-balancer tests, and a benchmark peer
  curl wrk openssl           # HTTP client, load generator, test certificates
  chromium                   # the demo page's browser test (headless)
  prometheus                 # promtool checks the /metrics output
  clang-format clang-tidy    # format and lint
  # Fuzzing (scripts/fuzz.sh): clang 14, its libFuzzer/ASan/UBSan runtimes
  # (libclang-rt-14-dev), llvm-symbolizer for readable crash stacks (llvm; only
  # recommended by clang), ccache for the clang build.
  clang libclang-rt-14-dev llvm ccache
  procps psmisc iproute2
  python3 systemd            # tests/docs' runner; systemd-analyze verify of examples/systemd
)
# Calendar quotas read time zones from the system's tzdata at run time
# (src/core/calendar.cc), so it is needed to run, not only to test.
build_pkgs+=(tzdata)

pkgs=("${build_pkgs[@]}")
[[ "${1:-}" == "--build" ]] || pkgs+=("${test_pkgs[@]}")

# Node.js: any installed node/npm will do (a Node.js build that bundles npm
# conflicts with Debian's npm package, so only what is missing is installed).
if [[ "${1:-}" != "--build" ]]; then
  command -v node >/dev/null 2>&1 || pkgs+=(nodejs)
  command -v npm >/dev/null 2>&1 || pkgs+=(npm)
fi

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
# The browser test's npm packages (playwright-core, pinned by the lockfile; it
# drives Debian's chromium and downloads no browser). Run after the Debian
# packages (node, npm) are in place.
# The Envoy test client's (@grpc/grpc-js, @grpc/proto-loader, and
# @grpc/grpc-js-xds for Envoy's own .proto files), pinned the same way.
npm_deps() {
  [[ "${1:-}" == "--build" ]] && return 0
  local root dir marker
  root="$(cd "$(dirname "$0")/.." && pwd)"
  for pair in "tests/e2e/browser:playwright-core" "tests/envoy/client:@grpc/grpc-js-xds"; do
    dir="$root/${pair%%:*}"
    marker="$dir/node_modules/${pair#*:}/package.json"
    if [[ ! -f "$marker" ]]; then
      echo "install-deps: npm ci in ${pair%%:*}"
      (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
    fi
  done
}

if ((${#missing[@]} == 0)); then
  npm_deps "${1:-}"
  exit 0
fi

SUDO=()
if [[ $(id -u) -ne 0 ]]; then SUDO=(sudo); fi
echo "install-deps: installing ${missing[*]}"
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
# The Debian packages start system services; the tests start their own on free ports.
for svc in redis-server nginx prometheus; do
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet "$svc" 2>/dev/null; then
    "${SUDO[@]}" systemctl stop "$svc" || true
  fi
done
npm_deps "${1:-}"
