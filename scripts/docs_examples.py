#!/usr/bin/env python3
"""Runs the code blocks the docs mark as runnable against a live server.

A block is runnable when the line before its opening fence is `<!-- runnable -->`. Each block runs as written, with
the documented address (127.0.0.1 or localhost, port 8000, or 11434 for the Ollama examples) replaced by the test server's: `python` blocks with this
interpreter, `sh` blocks with bash (scripts/node_modules/.bin on PATH, for wscat), `js` blocks as an ES module run
by node from scripts/ (where the pinned SDKs are installed). A block passes when it exits 0 and prints something.

Usage: docs_examples.py PORT FILE.md...
"""
import os
import re
import subprocess
import sys

BLOCK_TIMEOUT = 120  # seconds; a hang catcher, a block against stories260K takes about one


def blocks(path):
    lines = open(path, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        if lines[i].strip() == "<!-- runnable -->" and i + 1 < len(lines) and lines[i + 1].startswith("```"):
            lang = lines[i + 1][3:].strip()
            j = i + 2
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            yield i + 2, lang, "\n".join(lines[i + 2 : j]) + "\n"
            i = j
        i += 1


def main():
    port, files = sys.argv[1], sys.argv[2:]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PATH"] = os.path.join(root, "scripts", "node_modules", ".bin") + os.pathsep + env["PATH"]
    ran = failed = 0
    for path in files:
        for line, lang, code in blocks(path):
            code = re.sub(r"(127\.0\.0\.1|localhost):(8000|11434)\b", r"\g<1>:" + port, code)
            if lang == "python":
                cmd, cwd = [sys.executable, "-c", code], root
            elif lang in ("sh", "bash"):
                cmd, cwd = ["bash", "-euo", "pipefail", "-c", code], root
            elif lang == "js":
                cmd, cwd = ["node", "--input-type=module", "-e", code], os.path.join(root, "scripts")
            else:
                print(f"FAIL {path}:{line}: a runnable block of language {lang!r}, which this runner cannot run")
                failed += 1
                continue
            ran += 1
            try:
                res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT)
                ok, out, err = res.returncode == 0 and res.stdout.strip() != "", res.stdout, res.stderr
                why = f"exit {res.returncode}" if res.returncode else "no output"
            except subprocess.TimeoutExpired as e:
                ok, out, err, why = False, e.stdout or "", e.stderr or "", f"no exit in {BLOCK_TIMEOUT} s"
            if ok:
                print(f"ok   {path}:{line} ({lang}): {out.strip()[:80]!r}")
            else:
                failed += 1
                print(f"FAIL {path}:{line} ({lang}): {why}\n--- stdout\n{out}\n--- stderr\n{err}")
    print(f"{ran} runnable blocks, {failed} failed")
    if ran == 0:
        print("FAIL: no runnable blocks found")
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
