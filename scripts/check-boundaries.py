#!/usr/bin/env python3
"""Compiles each probe of tests/boundaries/ with the exact flags of a real
source file (from a build's compile_commands.json) and checks the outcome.

    scripts/check-boundaries.py BUILD_DIR

A probe starts with two comments:
    // compile-as: src/policy/policy.cc     whose flags (include paths) to use
    // expect: 'store/x.h' file not found   a text the compiler must print
            (or `expect: ok`: must compile cleanly)
so a wrong-way include, or a guarded member read without its mutex, is shown
to fail for the reason given, not for a broken command line. Called by
scripts/lint.sh on its clang build (build-lint/). Exits 1 on any mismatch.
"""
import json
import os
import pathlib
import shlex
import subprocess
import sys

root = pathlib.Path(__file__).resolve().parent.parent
build = pathlib.Path(sys.argv[1]).resolve()
db = {os.path.realpath(e["file"]): e for e in json.loads((build / "compile_commands.json").read_text())}


def command_for(like, probe):
    entry = db.get(os.path.realpath(root / like))
    if entry is None:
        sys.exit(f"check-boundaries: {like} is not in {build}/compile_commands.json")
    args = shlex.split(entry["command"]) if "command" in entry else entry["arguments"]
    if os.path.basename(args[0]) == "ccache":
        args = args[1:]
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in ("-o", "-MF", "-MT", "-MQ", "-c"):
            skip = a != "-c"
        elif a in ("-MD", "-MMD") or os.path.realpath(os.path.join(entry["directory"], a)) == os.path.realpath(entry["file"]):
            pass
        else:
            out.append(a)
    return out + ["-fsyntax-only", str(probe)], entry["directory"]


failed = 0
probes = sorted((root / "tests" / "boundaries").glob("*.cc"))
for probe in probes:
    head = dict(line[3:].split(": ", 1) for line in probe.read_text().splitlines()[:2])
    like, expect = head["compile-as"].strip(), head["expect"].strip()
    cmd, cwd = command_for(like, probe)
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    text = r.stdout + r.stderr
    ok = (r.returncode == 0 and not text.strip()) if expect == "ok" else (r.returncode != 0 and expect in text)
    first = next((l for l in text.splitlines() if "error" in l), "compiles")
    print(f"  {'ok  ' if ok else 'FAIL'} {probe.name} (as {like}): {first}")
    if not ok:
        failed += 1
        print(f"       expected: {expect}\n       command: {shlex.join(cmd)}\n" + text)
if failed:
    sys.exit(f"check-boundaries: {failed} of {len(probes)} probes did not fail as they should")
print(f"check-boundaries: {len(probes)} probes as expected")
