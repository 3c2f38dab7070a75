#!/usr/bin/python3
"""One configuration path: fails when an environment variable is read outside the config
module, or when the variables are not listed exactly once.

  check_config_reads.py SOURCE_DIR      checks the tree
  check_config_reads.py --self-test     checks that each rule catches what it should

Rules:
  1. C/C++: the process environment (getenv, secure_getenv, environ) is read only in
     gloo_ext/config.cc (gloo_ext::ReadEnvironment). bench/ programs may read their own
     knobs (BENCH_*, each named in bench/README.md, or a name of kOtherModuleNames); tests/
     may read their own switches, never a library variable, and an OPTIREDUCE_* switch is
     one of kOtherModuleNames (OPTIREDUCE_TEST_*), so the library does not warn about it.
  2. Python and shell: an OPTIREDUCE_*/GLOO_* name read from os.environ / os.getenv or
     expanded as $NAME must be one the config table documents (the Python package reads
     OPTIREDUCE_TORCH_LIB before it can load the library, and optireduce.RedisStore the
     Redis variables), or one config.cc's kOtherModuleNames gives to the tests, bench or
     build scripts.
  3. gloo_ext/config.cc's table lists every name and alias once, and gloo_ext/README.md's
     variable table lists exactly the same names, each once, with the same alias.
"""

import os
import re
import sys

CONFIG_MODULE = "gloo_ext/config.cc"
CXX_DIRS = ("algorithms", "transport_dpdk", "rendezvous", "gloo_ext", "bench", "tests")
PY_DIRS = ("gloo_ext", "bench", "tests", "scripts")
SH_DIRS = ("bench", "tests", "scripts")
# This checker's own self-test cases are strings that look like reads.
SELF = "tests/gloo_ext/check_config_reads.py"
CXX_EXT = (".cc", ".h", ".cpp", ".c", ".hpp")
# Listed in the README's table for users, read by PyTorch itself, not by optireduce.
READ_BY_TORCH = {"GLOO_DEVICE_TRANSPORT"}

ENV_CALL = re.compile(r"\b(?:std::)?(?:secure_)?getenv\s*\(\s*(\"([^\"]*)\")?")
ENVIRON = re.compile(r"\benviron\b")
PY_READ = re.compile(
    r"""(?:os\.environ\.get|os\.getenv|os\.environ\.setdefault|environ\.get)\(\s*["']([A-Z0-9_]+)["']"""
    r"""|os\.environ\[\s*["']([A-Z0-9_]+)["']\s*\](?!\s*=[^=])""")
OTHER_ROW = re.compile(r"^\s*\{\"(OPTIREDUCE_[A-Z0-9_]*)\", \"", re.M)
TABLE_ROW = re.compile(r"^\s*\{\"([A-Z][A-Z0-9_]*)\", \"([A-Z0-9_]*)\",", re.M)
SH_READ = re.compile(r"\$\{?((?:OPTIREDUCE|GLOO)_[A-Z0-9_]+)")
README_ROW = re.compile(r"^\| `([A-Z][A-Z0-9_]*)` \| (?:`([A-Z][A-Z0-9_]*)`|—) \|", re.M)


def library_name(name):
    return name.startswith(("OPTIREDUCE_", "GLOO_"))


def owned(name, other_modules):
    """True when config.cc's kOtherModuleNames gives `name` to another module (an entry
    ending in '_' is a prefix)."""
    return any(name.startswith(o) if o.endswith("_") else name == o for o in other_modules)


def strip_comments(text):
    """C/C++ text with // and /* */ comments blanked (line numbers kept)."""
    text = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def cxx_problems(rel, text, documented, other_modules=(), bench_readme=None):
    """Rule 1 for one C/C++ file: a list of 'file:line: problem'. bench_readme: the text
    bench/README.md, which names every knob a bench program reads (None: not checked)."""
    if rel == CONFIG_MODULE:
        return []
    problems = []
    for n, line in enumerate(strip_comments(text).splitlines(), 1):
        for m in ENV_CALL.finditer(line):
            name = m.group(2)
            if name is None:
                problems.append(f"{rel}:{n}: reads the environment with a computed name "
                                f"(use gloo_ext::ReadEnvironment / ConfigFromEnvironment)")
            elif rel.startswith("tests/"):
                if name in documented:
                    problems.append(f"{rel}:{n}: reads library variable {name} (tests reach "
                                    f"it through gloo_ext's *FromEnvironment helpers)")
                elif library_name(name) and not owned(name, other_modules):
                    problems.append(f"{rel}:{n}: test switch {name} is not a name of "
                                    f"{CONFIG_MODULE}'s kOtherModuleNames (OPTIREDUCE_TEST_*): "
                                    f"the library warns about it as unknown")
            elif rel.startswith("bench/") and library_name(name):
                if not owned(name, other_modules):
                    problems.append(f"{rel}:{n}: reads {name} with getenv outside "
                                    f"{CONFIG_MODULE} (use gloo_ext::ReadEnvironment or "
                                    f"ConfigFromEnvironment)")
            elif rel.startswith("bench/"):
                # The bench programs' own BENCH_* knobs, each documented.
                if bench_readme is not None and f"`{name}`" not in bench_readme:
                    problems.append(f"{rel}:{n}: bench knob {name} is not named (`{name}`) "
                                    f"in bench/README.md")
            elif rel.startswith(("transport_dpdk/", "rendezvous/", "algorithms/")):
                problems.append(f"{rel}:{n}: reads {name} with getenv: this layer takes its "
                                f"settings in its attr/options struct, which gloo_ext fills "
                                f"from {CONFIG_MODULE} (gloo_ext/devices.h)")
            else:
                problems.append(f"{rel}:{n}: reads {name} with getenv outside {CONFIG_MODULE} "
                                f"(use gloo_ext::ReadEnvironment or ConfigFromEnvironment)")
        if ENVIRON.search(line) and not rel.startswith("tests/"):
            problems.append(f"{rel}:{n}: reads `environ` outside {CONFIG_MODULE}")
    return problems


def py_problems(rel, text, documented, other_modules=()):
    """Rule 2 for one Python file. other_modules: names (prefixes when they end in '_')
    that config.cc's kOtherModuleNames gives to the tests, bench and build scripts."""
    problems = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("#"):
            continue
        for m in PY_READ.finditer(line):
            name = m.group(1) or m.group(2)
            if library_name(name) and name not in documented and not owned(name, other_modules):
                problems.append(f"{rel}:{n}: reads {name}, which gloo_ext/config.cc's table "
                                f"does not document")
    return problems


def sh_problems(rel, text, documented, other_modules=()):
    """Rule 2 for one shell script: $OPTIREDUCE_*/$GLOO_* expansions."""
    problems = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("#"):
            continue
        for m in SH_READ.finditer(line):
            name = m.group(1)
            if name not in documented and not owned(name, other_modules):
                problems.append(f"{rel}:{n}: reads {name}, which neither gloo_ext/config.cc's "
                                f"table nor its kOtherModuleNames lists")
    return problems


def table_names(config_cc):
    """(name, alias) rows of config.cc's variable table."""
    start = config_cc.index("const std::vector<VariableDoc>& Table()")
    end = config_cc.index("};", start)
    return TABLE_ROW.findall(config_cc[start:end])


def other_module_names(config_cc):
    """The names of config.cc's kOtherModuleNames."""
    start = config_cc.index("kOtherModuleNames[] = {")
    end = config_cc.index("};", start)
    return OTHER_ROW.findall(config_cc[start:end])


def table_problems(rows, readme):
    """Rule 3."""
    problems = []
    seen = {}
    for name, alias in rows:
        for n in (name, alias):
            if n and n in seen:
                problems.append(f"{CONFIG_MODULE}: {n} is listed twice in the table")
            seen[n] = True
    aliases = dict(rows)
    readme_rows = README_ROW.findall(readme)
    listed = {}
    for name, alias in readme_rows:
        if name in listed:
            problems.append(f"gloo_ext/README.md: {name} is listed twice")
        listed[name] = alias
        if name in READ_BY_TORCH:
            continue
        if name not in aliases:
            problems.append(f"gloo_ext/README.md: {name} is not in {CONFIG_MODULE}'s table")
        elif aliases[name] != alias:
            problems.append(f"gloo_ext/README.md: {name}'s alias is '{alias}', "
                            f"{CONFIG_MODULE} says '{aliases[name]}'")
    for name, _ in rows:
        if name not in listed:
            problems.append(f"gloo_ext/README.md: the variable table lacks {name}")
    return problems


def check_tree(root):
    config_cc = open(os.path.join(root, CONFIG_MODULE)).read()
    rows = table_names(config_cc)
    if len(rows) < 10:
        return [f"{CONFIG_MODULE}: found only {len(rows)} table rows (did its format change?)"]
    documented = {n for row in rows for n in row if n}
    others = other_module_names(config_cc)
    if "OPTIREDUCE_TEST_" not in others:
        return [f"{CONFIG_MODULE}: kOtherModuleNames not found (did its format change?)"]
    problems = table_problems(rows, open(os.path.join(root, "gloo_ext/README.md")).read())
    bench_readme = open(os.path.join(root, "bench/README.md")).read()
    checked = 0
    for top in sorted(set(CXX_DIRS + PY_DIRS + SH_DIRS)):
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames[:] = [d for d in dirnames if d not in ("corpus", "__pycache__")]
            for f in sorted(filenames):
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, root)
                if rel == SELF:
                    continue
                if f.endswith(CXX_EXT) and top in CXX_DIRS:
                    problems += cxx_problems(rel, open(path, errors="replace").read(), documented,
                                             others, bench_readme)
                    checked += 1
                elif f.endswith(".py") and top in PY_DIRS:
                    problems += py_problems(rel, open(path, errors="replace").read(), documented,
                                            others)
                    checked += 1
                elif f.endswith(".sh") and top in SH_DIRS:
                    problems += sh_problems(rel, open(path, errors="replace").read(), documented,
                                            others)
                    checked += 1
    if checked < 50:
        problems.append(f"only {checked} source files found under {root}")
    return problems


def self_test():
    documented = {"OPTIREDUCE_FAULTS", "OPTIREDUCE_TORCH_LIB", "GLOO_DPDK_EAL_ARGS"}
    cases = [
        (cxx_problems, "transport_dpdk/x.cc", 'const char* e = std::getenv("OPTIREDUCE_FAULTS");', 1),
        (cxx_problems, "rendezvous/x.cc", 'auto* v = getenv(name.c_str());', 1),
        (cxx_problems, "algorithms/x.cc", "for (char** e = environ; *e; e++) {}", 1),
        (cxx_problems, "bench/x.cc", 'if (getenv("OPTIREDUCE_EAL_ARGS")) {}', 1),
        (cxx_problems, "bench/x.cc", 'if (getenv("BENCH_SPIN_US")) {}', 0),
        (cxx_problems, "bench/x.cc", 'if (getenv("BENCH_SPIN_UZ")) {}', 1),  # not in the README
        (cxx_problems, "bench/x.cc", 'if (getenv("OPTIREDUCE_BENCH_STATS")) {}', 0),
        (cxx_problems, "tests/x.cc", 'setenv("OPTIREDUCE_FAULTS", "x", 1); getenv("OPTIREDUCE_FAULTS");', 1),
        (cxx_problems, "tests/x.cc", 'getenv("OPTIREDUCE_TEST_CASES");', 0),
        (cxx_problems, "tests/x.cc", 'getenv("OPTIREDUCE_SOAK_SECONDS");', 1),  # not owned
        (cxx_problems, "tests/x.cc", 'getenv("DEBUG_STATS");', 0),
        (cxx_problems, "gloo_ext/config.cc", 'std::getenv(std::string(name).c_str());', 0),
        (cxx_problems, "transport_dpdk/x.cc", '// reads nothing: getenv("OPTIREDUCE_FAULTS")', 0),
        (py_problems, "gloo_ext/python/x.py", 'p = os.environ.get("OPTIREDUCE_TORCH_LIB")', 0),
        (py_problems, "bench/x.py", 'p = os.environ.get("OPTIREDUCE_TORCH_LIBRARY")', 1),
        (py_problems, "bench/x.py", 'p = os.environ["GLOO_ALGOS"]', 1),
        (py_problems, "bench/x.py", 'env["OPTIREDUCE_X"] = "1"', 0),
        (py_problems, "bench/x.py", 'd = os.environ.get("OPTIREDUCE_BUILD_DIR", "build")', 0),
        (py_problems, "bench/x.py", 'd = os.environ.get("OPTIREDUCE_BENCH_BIN")', 0),
        (py_problems, "bench/x.py", 'd = os.environ.get("OPTIREDUCE_BUILD_DIRS")', 1),
        (py_problems, "tests/x.py", 'd = os.environ.get("OPTIREDUCE_SWEEP_BIN")', 1),
        (sh_problems, "scripts/x.sh", 'B=${OPTIREDUCE_BUILD_DIR:-build}', 0),
        (sh_problems, "scripts/x.sh", 'J=${OPTIREDUCE_FUZZ_JOBS:-2} S=$OPTIREDUCE_FUZZ_SEED', 0),
        (sh_problems, "scripts/x.sh", 'J=${OPTIREDUCE_JOBS:-2}', 1),
        (sh_problems, "scripts/x.sh", '# J=${OPTIREDUCE_JOBS:-2}', 0),
    ]
    failures = []
    others = ["OPTIREDUCE_BENCH_", "OPTIREDUCE_BUILD_DIR", "OPTIREDUCE_TEST_", "OPTIREDUCE_FUZZ_"]
    bench_readme = "`BENCH_SPIN_US` sets the spin"
    for fn, rel, text, want in cases:
        if fn is cxx_problems:
            got = fn(rel, text, documented, others, bench_readme)
        else:
            got = fn(rel, text, documented, others)
        if len(got) != want:
            failures.append(f"{fn.__name__}({rel!r}, {text!r}): {len(got)} problems, want {want}: {got}")
    rows = [("OPTIREDUCE_A", ""), ("OPTIREDUCE_B", "GLOO_DPDK_B")]
    good = "| `OPTIREDUCE_A` | — | x | y |\n| `OPTIREDUCE_B` | `GLOO_DPDK_B` | x | y |\n"
    for readme, rows_, want in [
            (good, rows, 0),
            (good + "| `OPTIREDUCE_A` | — | x | y |\n", rows, 1),  # listed twice
            ("| `OPTIREDUCE_A` | — | x | y |\n", rows, 1),        # missing B
            (good.replace("`GLOO_DPDK_B`", "—"), rows, 1),       # alias lost
            (good, rows + [("OPTIREDUCE_C", "OPTIREDUCE_A")], 2)]:  # A twice; C not in README
        got = table_problems(rows_, readme)
        if len(got) != want:
            failures.append(f"table_problems: {len(got)} problems, want {want}: {got}")
    return failures


def main(argv):
    if argv[1:] == ["--self-test"]:
        problems = self_test()
    elif len(argv) == 2:
        problems = check_tree(argv[1])
    else:
        print(__doc__)
        return 2
    for p in problems:
        print(p)
    print(f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
