#!/usr/bin/env python3
"""Checks that every folder README's file table matches the tree.

Each source file (*.cc, *.h, *.py, *.sh) belongs to the README.md of its folder, or of the
nearest folder above it that has one (a subfolder without a README is covered by its
parent's); the README at the root does not count. A README mentions a file in backticks:
its path relative to the README's folder (`bounded/bounded_receiver.cc`) or to the root
(`transport_dpdk/bounded/bounded_receiver.cc`), or its name
alone when no other file of that README has the same name. `name.{h,cc}` and `name.*`
stand for every file they expand to.

Fails, naming each one:
  - a source file that no README covers, or that its README does not mention;
  - a backticked file name in a README (one of the extensions above, or .md) that matches
    no file: relative to the README's folder, to the root, or by name in its scope.

Usage: scripts/check-file-tables.py [ROOT]   (default: this repository; in a git work
tree the files git tracks or would track, else every file but build trees)
"""
import fnmatch
import os
import re
import subprocess
import sys

SOURCE_EXTENSIONS = (".cc", ".h", ".py", ".sh")
MENTION_EXTENSIONS = SOURCE_EXTENSIONS + (".md",)
# Headers of the libraries the project builds against: READMEs name them, they are not ours.
EXTERNAL_PREFIXES = ("gloo/", "torch/", "c10/", "absl/", "rte_", "linux/", "sys/", "hiredis/",
                     "bpf/", "xdp/", "netinet/", "net/", "gtest/", "benchmark/", "/")
SKIP_DIRS = {".git", "__pycache__"}


def list_files(root):
    try:
        out = subprocess.run(
            ["git", "-C", root, "ls-files", "--cached", "--others", "--exclude-standard"],
            check=True, capture_output=True, text=True).stdout
        if subprocess.run(["git", "-C", root, "rev-parse", "--show-toplevel"], check=True,
                          capture_output=True, text=True).stdout.strip() == os.path.realpath(root):
            return sorted(p for p in out.splitlines() if os.path.isfile(os.path.join(root, p)))
    except (OSError, subprocess.CalledProcessError):
        pass
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        dirnames[:] = [d for d in dirnames
                       if d not in SKIP_DIRS and not (rel == "." and d.startswith("build"))]
        for f in filenames:
            files.append(os.path.normpath(os.path.join(rel, f)))
    return sorted(files)


def expand(token):
    """`a.{h,cc}` -> [a.h, a.cc]; anything else -> [token]."""
    m = re.search(r"\{([^{}]*)\}", token)
    if not m:
        return [token]
    out = []
    for alt in m.group(1).split(","):
        out.extend(expand(token[:m.start()] + alt + token[m.end():]))
    return out


def backticked(text):
    # Fenced code blocks hold commands and output, not the file table.
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.findall(r"`([^`\n]+)`", text)


def looks_like_file(name):
    return (name.endswith(MENTION_EXTENSIONS) or name.endswith(".*")) and " " not in name \
        and not name.startswith(EXTERNAL_PREFIXES)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    root = os.path.abspath(root)
    files = list_files(root)
    existing = set(files)
    readme_dirs = {os.path.dirname(f) for f in files
                   if os.path.basename(f) == "README.md" and os.path.dirname(f) != ""}
    scope = {d: [] for d in readme_dirs}  # README folder -> paths relative to it
    problems = []
    for f in files:
        if not f.endswith(SOURCE_EXTENSIONS):
            continue
        d = os.path.dirname(f)
        while d != "" and d not in readme_dirs:
            d = os.path.dirname(d)
        if d == "":
            problems.append(f"{f}: no folder README covers it (add a README.md with a file "
                            f"table to its folder or a parent folder)")
            continue
        scope[d].append(os.path.relpath(f, d))

    for d in sorted(readme_dirs):
        readme = os.path.join(d, "README.md")
        with open(os.path.join(root, readme), encoding="utf-8") as fh:
            tokens = [t.strip() for t in backticked(fh.read())]
        tokens = [t[2:] if t.startswith("./") else t for t in tokens]
        names = [n for t in tokens for n in expand(t) if looks_like_file(n)]
        by_base = {}
        for rel in scope[d]:
            by_base.setdefault(os.path.basename(rel), []).append(rel)
        mentioned = set()
        for n in names:
            hits = [rel for rel in scope[d] if fnmatch.fnmatchcase(rel, n)
                    or fnmatch.fnmatchcase(os.path.join(d, rel), n)]
            if not hits and "/" not in n:
                hits = [rel for rel in scope[d]
                        if fnmatch.fnmatchcase(os.path.basename(rel), n)
                        and len(by_base[os.path.basename(rel)]) == 1]
            mentioned.update(hits)
            if hits:
                continue
            elsewhere = [n, os.path.join(d, n)]
            if any(fnmatch.filter(existing, p) for p in elsewhere) or \
                    any(fnmatch.fnmatchcase(os.path.basename(f), n) for f in existing):
                continue
            problems.append(f"{readme}: mentions `{n}`, which does not exist")
        for rel in sorted(scope[d]):
            if rel not in mentioned:
                hint = (" (its name is not unique here: write the path)"
                        if len(by_base[os.path.basename(rel)]) > 1 else "")
                problems.append(f"{os.path.join(d, rel)}: not in {readme}'s file table{hint}")
    for p in problems:
        print(p)
    if problems:
        print("check-file-tables: each folder README names every source file of its folder "
              "(and of subfolders without their own README) in backticks, with its job, and "
              "names no file that does not exist.", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
