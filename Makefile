# The two commands of the README:
#   make run    install what is missing, build ratelimitd (and build/rl-lab, the README's lab),
#               start ratelimitd on its embedded default
#   make test   install what is missing, build, run the whole suite (also under ASan+UBSan and TSan)
# `make` alone builds build/ratelimitd.

JOBS  ?= $(shell nproc)
CMAKE ?= cmake
GEN   := -G Ninja
ARGS  ?=

.PHONY: all build deps build-deps run test chaos soak lint format bench fuzz clean

FUZZ_SECONDS ?= 30

all: build

deps:
	@scripts/install-deps.sh

build-deps:
	@scripts/install-deps.sh --build

build/build.ninja:
	$(CMAKE) -S . -B build $(GEN) -DCMAKE_BUILD_TYPE=RelWithDebInfo

build: build-deps build/build.ninja
	ninja -C build -j $(JOBS)

run: build-deps build/build.ninja
	ninja -C build -j $(JOBS) ratelimitd rl-lab
	./build/ratelimitd $(ARGS)

# The whole suite: normal build, then ASan+UBSan (everything), then TSan
# (the concurrency tests). Every server a test needs is started by the test
# itself on a free loopback port and stopped after it.
test: deps
	scripts/run-tests.sh

# Only the chaos tests (tests/chaos: Redis killed / frozen / flushed under
# load), one at a time; `make test` runs them too.
chaos: deps build
	ctest --test-dir build --output-on-failure -L chaos

# A long run (SOAK_MINUTES, default 10) at half capacity with Redis restarted
# and frozen and the config reloaded; table and plot in bench/results/soak.*.
# Not part of make test.
SOAK_MINUTES ?= 10
soak: deps
	SOAK_MINUTES=$(SOAK_MINUTES) scripts/soak.sh

# Formatting, the module boundaries (tests/boundaries/), clang-tidy and
# Clang's thread-safety analysis over src/ (scripts/lint.sh). LINT_TIDY=0
# checks the formatting only.
lint:
	scripts/lint.sh

format:
	clang-format -i $$(git ls-files '*.h' '*.cc')

bench: deps
	scripts/bench.sh

# Every libFuzzer target (fuzz/) for FUZZ_SECONDS each, under ASan+UBSan.
fuzz: deps
	scripts/fuzz.sh $(FUZZ_SECONDS)

clean:
	rm -rf build build-asan build-tsan build-release build-fuzz
