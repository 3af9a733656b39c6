#!/usr/bin/env python3
"""Runs the command blocks of README.md and docs/*.md marked runnable, as shown.

    tests/docs/run_doc_blocks.py --source-dir . --ratelimitd build/ratelimitd [FILE...]

A marker (an HTML comment) right before a block (fenced, or indented by four
spaces) says what it is; docs/testing.md is the manual:

    <!-- runnable -->                          run it
    <!-- runnable: daemon=default -->          ... beside `ratelimitd` (embedded default)
    <!-- runnable: daemon=examples/x.yaml -->  ... beside `ratelimitd --config examples/x.yaml`
    <!-- runnable: needs=redis,upstream -->    ... with a redis-server / an HTTP upstream
    <!-- runnable: continue -->                ... in the previous block's daemon, servers, folder
    <!-- output -->                            this block is the previous command's output
    <!-- not-runnable: why -->                 a command block that is not run, and why

Commands and their output: `$ cmd` lines are commands (continued by a
trailing `\\` or by `> ` lines) and the lines up to the next `$ ` their
output. A block without `$ ` is a script: a `#` comment right under a command
is its output; any other line, a command. `...` in an output matches
anything, `<n>` a number; an output line starting with white space continues
the line above (wrapped JSON); a last output line `[exit N]` expects that exit
status, otherwise every command must exit 0.

Each block runs in bash in a fresh folder where examples/ and docs/ are the
source tree's and `build/ratelimitd` (and `ratelimitd` on PATH) is the built
binary on the test's free ports: localhost:8080 and :9090 in a block are
those ports, :6379 the test's Redis, :3000 and :9000 its upstream. A
`ratelimitd ... &` line waits until the daemon listens; a ratelimitd started
in the foreground must listen, and then exit 0 on SIGTERM.

Exits 1 when a block's output or exit status differs (with a diff), when a
command block has no marker or a marker no block, or when KNOWN_FAILURES is
stale. Standard library only.
"""

import argparse
import difflib
import glob
import http.server
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

# (file, first command of the block) -> why it fails today. Such a block still
# fails (the reason is printed); an entry whose block passes fails too.
KNOWN_FAILURES = {}

MARKER = re.compile(r"^<!--\s*(runnable|not-runnable|output)\b:?\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(```+|~~~+)\s*([\w+-]*)")
COMMAND_START = re.compile(r"^(\$ |make\b|build/|scripts/|ratelimitd\b|curl\b|ctest\b|[A-Z_]+=)")
SHELL_INFO = {"sh", "bash", "shell", "console"}
BLOCK_TIMEOUT = 30


class Block:
    def __init__(self, path, line, lines, info, fenced):
        self.path, self.line, self.lines, self.info, self.fenced = path, line, lines, info, fenced
        self.marker, self.options, self.after_prose = None, "", False

    def is_command_block(self):
        first = next((l for l in self.lines if l.strip()), "")
        return self.info in SHELL_INFO if self.fenced else bool(COMMAND_START.match(first))


def read_blocks(path):
    """The fenced and indented code blocks of a markdown file with their markers,
    and the line numbers of markers followed by prose instead of a block."""
    lines = open(path, encoding="utf-8").read().split("\n")
    blocks, stray, marker, marker_line, prose, i = [], [], None, 0, False, 0
    while i < len(lines):
        line = lines[i]
        m, fence = MARKER.match(line), FENCE.match(line)
        if m:
            if marker:
                stray.append(marker_line)
            marker, marker_line, i = m, i + 1, i + 1
            continue
        if fence:
            end = i + 1
            while end < len(lines) and not lines[end].startswith(fence.group(1)):
                end += 1
            block = Block(path, i + 1, lines[i + 1:end], fence.group(2), True)
            i = end + 1
        elif line.startswith("    ") and (i == 0 or not lines[i - 1].strip() or marker):
            end = i
            while end < len(lines) and (lines[end].startswith("    ") or not lines[end].strip()):
                end += 1
            body = [l[4:] for l in lines[i:end]]
            while body and not body[-1].strip():
                body.pop()
            block, i = Block(path, i + 1, body, "", False), end
        else:
            if line.strip() and marker:
                stray.append(marker_line)
                marker = None
            prose = prose or bool(line.strip())
            i += 1
            continue
        if marker:
            block.marker, block.options = marker.group(1), marker.group(2)
        block.after_prose, marker, prose = prose, None, False
        blocks.append(block)
    if marker:
        stray.append(marker_line)
    return blocks, stray


def parse_steps(block):
    """[(command text, expected output lines or None, exit status expected)]."""
    steps = []
    if any(l.startswith("$ ") for l in block.lines):
        for line in block.lines:
            if line.startswith("$ "):
                steps.append([line[2:], [], 0])
            elif steps and line.startswith("> ") and not steps[-1][1]:
                steps[-1][0] += "\n" + line[2:]
            elif steps and steps[-1][0].endswith("\\") and not steps[-1][1]:
                steps[-1][0] += "\n" + line
            elif steps:
                steps[-1][1].append(line)
    else:
        command, output = [], None
        for line in block.lines:
            if line.lstrip().startswith("#") and (output is not None or (
                    command and command[-1].strip() and is_complete("\n".join(command)))):
                output = (output or []) + [re.sub(r"^\s*# ?", "", line)]
                continue
            if output is not None:
                steps.append(["\n".join(command), output, 0])
                command, output = [], None
            command.append(line)
        if command or output is not None:
            steps.append(["\n".join(command), output, 0])
    for step in steps:
        if step[1] is not None:
            while step[1] and not step[1][-1].strip():
                step[1].pop()
            if step[1] and re.fullmatch(r"\[exit (\d+)\]", step[1][-1].strip()):
                step[2] = int(step[1].pop().strip()[6:-1])
    return steps


def unwrap(lines):
    """Shown output lines with the wrapped ones (starting with white space) joined."""
    out = []
    for line in lines:
        if out and line[:1].isspace():
            out[-1] += line.strip()
        else:
            out.append(line.rstrip())
    return out


def matches(expected, actual):
    """Whether the actual lines are the shown ones, `...` and `<n>` as placeholders."""
    pattern = ""
    for part in re.split(r"(\.\.\.|<n>)", "\n".join(expected)):
        pattern += {"...": ".*?", "<n>": r"-?\d+(?:\.\d+)?"}.get(part, re.escape(part))
    return re.fullmatch(pattern, "\n".join(actual), re.DOTALL) is not None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, seconds=10):
    deadline = time.time() + seconds
    while time.time() < deadline and proc.poll() is None:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.05)
    return False


class Upstream(http.server.BaseHTTPRequestHandler):
    def answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        body = b'{"upstream":true}\n'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = answer

    def log_message(self, *args):
        pass


WRAPPER = """#!/bin/bash
# ratelimitd as the docs show it, on the test's ports (tests/docs/run_doc_blocks.py).
for a in "$@"; do
  case $a in --check-config|--check-config=*|--explain|--explain=*|--help|-h|--version) exec "$RL_BIN" "$@";; esac
done
exec "$RL_BIN" "$@" --listen "127.0.0.1:$RL_PORT" --admin-listen "127.0.0.1:$RL_ADMIN_PORT" >"$RL_LOG.$$" 2>&1
"""

PREAMBLE = r"""exec 2>&1
rl_wait_ready() {  # until ratelimitd (pid $1, started by the wrapper) logs that it listens
  for _ in $(seq 200); do
    grep -qs '"msg":"listening"' "$RL_LOG.$1" && return 0
    kill -0 "$1" 2>/dev/null || { echo "ratelimitd exited before listening:"; cat "$RL_LOG.$1"; return 1; }
    sleep 0.05
  done
  echo "ratelimitd did not listen within 10 s:"; cat "$RL_LOG.$1"; return 1
}
rl_serve() {  # a server started in the foreground: it listens, then exits 0 on SIGTERM
  "$@" & local pid=$!
  rl_wait_ready "$pid" || return 1
  local rc=0; kill -TERM "$pid"; wait "$pid" || rc=$?
  [ "$rc" = 0 ] || { echo "ratelimitd exited $rc on SIGTERM:"; cat "$RL_LOG.$pid"; }
  return "$rc"
}
trap 'kill $(jobs -p) 2>/dev/null; wait' EXIT
"""

SERVER_LINE = r"^([ \t]*)((?:build/)?ratelimitd\b(?!.*--check-config|.*--explain|.*--help|.*--version)[^&|;#\n]*?)"
BACKGROUND = re.compile(SERVER_LINE + r"[ \t]*&[ \t]*$", re.M)
FOREGROUND = re.compile(SERVER_LINE + r"([ \t]+#.*)?$", re.M)


class Environment:
    """A folder, ports, the servers a block asked for and its daemon."""

    def __init__(self, args, options):
        self.dir = tempfile.mkdtemp(prefix="rl-docs.")
        self.processes, self.ports, self.httpd, self.daemon = [], {}, None, None
        for name in ("examples", "docs"):
            os.symlink(os.path.join(args.source_dir, name), os.path.join(self.dir, name))
        os.makedirs(os.path.join(self.dir, "build"))
        os.makedirs(os.path.join(self.dir, "bin"))
        with open(os.path.join(self.dir, ".curlrc"), "w") as f:
            f.write("no-progress-meter\n")  # as on a terminal: curl's meter goes to a pipe only
        for path in ("build/ratelimitd", "bin/ratelimitd"):
            with open(os.path.join(self.dir, path), "w") as f:
                f.write(WRAPPER)
            os.chmod(os.path.join(self.dir, path), 0o755)
        self.log = os.path.join(self.dir, "ratelimitd.log")
        self.ports = {8080: free_port(), 9090: free_port()}
        self.env = dict(os.environ, RL_BIN=args.ratelimitd, RL_LOG=self.log, CURL_HOME=self.dir,
                        RL_PORT=str(self.ports[8080]), RL_ADMIN_PORT=str(self.ports[9090]),
                        PATH=os.path.join(self.dir, "bin") + ":" + os.environ["PATH"])
        needs = set(filter(None, options.get("needs", "").split(",")))
        self.error = ""
        if "redis" in needs:
            port = free_port()
            self.ports[6379] = port
            self.processes.append(subprocess.Popen(
                ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", self.dir],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            if not wait_port(port, self.processes[-1]):
                self.error = "redis-server did not start"
        if "upstream" in needs:
            self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
            threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
            self.ports[3000] = self.ports[9000] = self.httpd.server_address[1]
        daemon = options.get("daemon")
        if daemon:
            argv = [args.ratelimitd] + ([] if daemon == "default" else ["--config", daemon])
            argv += ["--listen", f"127.0.0.1:{self.ports[8080]}",
                     "--admin-listen", f"127.0.0.1:{self.ports[9090]}"]
            log = open(self.log, "a")
            self.daemon = subprocess.Popen(argv, cwd=self.dir, stdout=log, stderr=log)
            self.processes.append(self.daemon)
            if not wait_port(self.ports[8080], self.daemon):
                self.error = f"{' '.join(argv)} did not start:\n" + open(self.log).read()

    def substitute(self, text):
        for shown, port in self.ports.items():
            text = re.sub(rf"\b(localhost|127\.0\.0\.1):{shown}\b", f"127.0.0.1:{port}", text)
        return text

    def unsubstitute(self, text):
        for shown, port in self.ports.items():
            text = text.replace(f"127.0.0.1:{port}", f"127.0.0.1:{shown}")
        return text

    def close(self):
        """Stops what it started; "" or why the daemon did not stop well."""
        problem = ""
        for p in reversed(self.processes):
            p.send_signal(signal.SIGTERM)
            try:
                rc = p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                rc = p.wait()
            if p is self.daemon and rc != 0:
                problem = f"the block's ratelimitd exited {rc} on SIGTERM:\n" + open(self.log).read()
        if self.httpd:
            self.httpd.shutdown()
        shutil.rmtree(self.dir, ignore_errors=True)
        return problem


def is_complete(code):
    """Whether bash reads `code` as whole commands (no open quote, heredoc, loop, `\\`)."""
    if code.endswith("\\"):
        return False
    check = subprocess.run(["bash", "-n", "-c", code], capture_output=True, text=True)
    return check.returncode == 0 and not check.stderr


def split_commands(text):
    """The shell commands of `text` one by one (comments and blank lines go with the next)."""
    commands, pending = [], []
    for line in text.split("\n"):
        pending.append(line)
        code = "\n".join(pending)
        only_comments = all(l.lstrip().startswith("#") or not l.strip() for l in pending)
        if not only_comments and is_complete(code):
            commands.append(code)
            pending = []
    if any(l.strip() and not l.lstrip().startswith("#") for l in pending):
        commands.append("\n".join(pending))  # incomplete: bash will say why
    return commands


def run_block(block, steps, env):
    """Runs the block's steps in one bash; returns a list of failure texts."""
    token = f"rl-{os.getpid()}-{time.monotonic_ns()}"
    script, commands = PREAMBLE, []  # commands: (as shown, exit status expected)
    for text, _, status in steps:
        script += f"printf '\\n{token} step\\n'\n"
        group = split_commands(text)
        for j, command in enumerate(group):
            commands.append((command, status if j == len(group) - 1 else 0))
            command = env.substitute(command)
            command = BACKGROUND.sub(r'\1\2 & rl_wait_ready "$!"', command)
            command = FOREGROUND.sub(r"\1rl_serve \2\3", command)
            script += (f"{command}\nrl_rc=$?; [ \"$rl_rc\" = {commands[-1][1]} ] || "
                       f"printf '\\n{token} exit %d {len(commands) - 1}\\n' \"$rl_rc\"\n")
    proc = subprocess.Popen(["bash", "-c", script], cwd=env.dir, env=env.env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=BLOCK_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        out += f"\n{token} exit -1 {len(commands) - 1}\n(killed after {BLOCK_TIMEOUT} s)"
    out = env.unsubstitute(out.replace("\r", ""))
    failures, exits = [], re.compile(rf"\n{token} exit (-?\d+) (\d+)\n")
    chunks = out.split(f"\n{token} step\n")[1:]
    for i, (text, expected, status) in enumerate(steps):
        chunk = chunks[i] if i < len(chunks) else ""
        shown = exits.sub("\n", chunk).strip("\n")
        for rc, index in exits.findall(chunk):
            command, want = commands[int(index)]
            failures.append(f"{block.path}:{block.line}: `{command.splitlines()[0]}` exited {rc}, "
                            f"expected {want}; its step printed:\n{shown}")
        actual = [l.rstrip() for l in exits.sub("", chunk).strip("\n").split("\n")]
        actual = actual if any(actual) else []
        if expected is not None and not matches(unwrap(expected), actual):
            diff = difflib.unified_diff(unwrap(expected), actual, "shown", "actual", lineterm="")
            failures.append(f"{block.path}:{block.line}: `{text.splitlines()[0]}`: "
                            "output differs\n" + "\n".join(diff))
    return failures


def plan(path, rel):
    """[(block, steps, options)] of a file's runnable blocks, and its marking mistakes."""
    blocks, stray = read_blocks(path)
    runnable = []
    mistakes = [f"{rel}:{line}: a marker with no block right after it" for line in stray]
    for i, block in enumerate(blocks):
        block.path = rel
        if block.marker is None and block.is_command_block():
            mistakes.append(f"{rel}:{block.line}: a command block without a marker "
                            "(<!-- runnable ... --> or <!-- not-runnable: why -->)")
        elif block.marker == "output":
            if block.after_prose or i == 0 or blocks[i - 1].marker != "runnable" or not (
                    runnable and runnable[-1][1]):
                mistakes.append(f"{rel}:{block.line}: <!-- output --> not right after a runnable block")
            else:
                runnable[-1][1][-1][1] = list(block.lines)
        elif block.marker == "runnable":
            options = dict(o.split("=", 1) if "=" in o else (o, "") for o in block.options.split())
            runnable.append((block, parse_steps(block), options))
    return runnable, mistakes


def run_and_report(block, steps, env, known_seen):
    """The block's failures, marked as known (or as a stale KNOWN_FAILURES entry)."""
    failures = [f"{block.path}:{block.line}: {env.error}"] if env.error else run_block(block, steps, env)
    key = (block.path, steps[0][0].splitlines()[0] if steps and steps[0][0] else "")
    if key not in KNOWN_FAILURES:
        return failures
    known_seen.add(key)
    if not failures:
        return [f"{block.path}:{block.line}: passes now: remove it from KNOWN_FAILURES"]
    return [f"KNOWN FAILURE ({KNOWN_FAILURES[key]}): " + f for f in failures]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source-dir", required=True)
    parser.add_argument("--ratelimitd", required=True)
    parser.add_argument("files", nargs="*", help="default: README.md and docs/*.md")
    args = parser.parse_args()
    args.source_dir = os.path.abspath(args.source_dir)
    args.ratelimitd = os.path.abspath(args.ratelimitd)
    files = args.files or [os.path.join(args.source_dir, "README.md")] + sorted(
        glob.glob(os.path.join(args.source_dir, "docs", "*.md")))
    # ctest's timeout sends SIGTERM: stop the servers on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("killed (SIGTERM)"))

    failures, known_seen, runs = [], set(), 0
    for path in files:
        rel = os.path.relpath(path, args.source_dir)
        runnable, mistakes = plan(path, rel)
        failures += mistakes
        env = None
        try:
            for block, steps, options in runnable:
                if env is None or "continue" not in options:
                    failures += [p for p in [env.close() if env else ""] if p]
                    env = Environment(args, options)
                failures += run_and_report(block, steps, env, known_seen)
                runs += 1
        finally:
            failures += [p for p in [env.close() if env else ""] if p]
    for key, why in KNOWN_FAILURES.items():
        if key not in known_seen and not args.files:
            failures.append(f"KNOWN_FAILURES entry {key} ({why}) matches no block: remove it")
    for f in failures:
        print("FAIL " + f + "\n")
    print(f"{runs} runnable blocks in {len(files)} files: "
          f"{'all ran as shown' if not failures else f'{len(failures)} failures'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
