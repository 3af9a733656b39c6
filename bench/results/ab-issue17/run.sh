#!/bin/bash
# Interleaved A/B: old (a = 2e5f3d7, before the redesign merges) and new (b = HEAD at build time)
# bench rows 1-5, one rep each, three rounds.
set -u
cd /work/ab
for i in ${ROUNDS:-1 2 3}; do
  for v in a b; do
    echo "== $v round $i $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> /work/ab/runs.log
    (cd /work/ab/$v && BENCH_JOBS=1 scripts/bench.sh --build-dir build-release --only 1,2,3,4,5 --reps 1 > /work/ab/run-$v-$i.md 2> /work/ab/run-$v-$i.err)
    echo "   rc=$? $(date +%T)" >> /work/ab/runs.log
  done
done
echo ALLDONE >> /work/ab/runs.log
