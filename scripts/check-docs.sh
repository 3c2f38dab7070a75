#!/usr/bin/env bash
# Fails when a project file reads like a work log: numbered session or issue references,
# "not kept" stories, dates, "#N" in headings, acceptance-item verdicts like "(b) holds",
# or a run's circumstances (load averages, "the run above", "in our runs").
# Docs and comments say what the code does now and why; that history lives in `git log`,
# measured numbers in the generated bench/RESULTS.md (exempt, with bench/results/).
# Usage: scripts/check-docs.sh [FILE...]   (default: every file git tracks)
set -euo pipefail
cd "$(dirname "$0")/.."
PATTERNS=(
  '\bsessions? [0-9]'                 # a numbered work session
  '\bissues? #?[0-9]'                 # a numbered issue
  '\bnot kept\b'                      # "tried, not kept"
  '\btried (locally|and|but)\b'       # "tried locally, not committed"
  '\b20[0-9]{2}-[01][0-9]-[0-3][0-9]\b'   # dates
  '^#+ .*#[0-9]'                      # "#5" in a heading
  '\([a-h]\) (holds|does not hold|is met)\b'
  '\bload average ~?[0-9]'            # a run's machine load: measured numbers live in
  '\bat load ~?[0-9]'                 #   bench/RESULTS.md (generated) only
  '\bload ~[0-9]'
  '\bthe run above\b'                 # "what changed since the run above"
  '\bin our runs\b'
)
if [ $# -gt 0 ]; then
  files=("$@")
else
  if git rev-parse --is-inside-work-tree > /dev/null 2>&1; then
    list=$(git ls-files)
  else  # an exported tree: every file but build trees
    list=$(find . -type f -not -path './build*' -not -path './.git/*' | sed 's|^\./||')
  fi
  mapfile -t files < <(printf '%s\n' "$list" |
    grep -Ev '^(bench/RESULTS\.md|bench/results/|scripts/check-docs\.sh$|tests/docs/)')
fi
args=()
for p in "${PATTERNS[@]}"; do args+=(-e "$p"); done
existing=()
for f in "${files[@]}"; do [ -f "$f" ] && existing+=("$f"); done
# -I: binary files are skipped. xargs may run grep in batches: judge by the output.
found=""
if [ ${#existing[@]} -gt 0 ]; then
  found=$(printf '%s\0' "${existing[@]}" | xargs -0 grep -nEiHI "${args[@]}" || true)
fi
if [ -n "$found" ]; then
  printf '%s\n' "$found"
  echo "check-docs: the lines above read like a work log (sessions, issues, dates, 'not kept', run load)." >&2
  echo "check-docs: say what the code does now and why; history goes in commit messages." >&2
  exit 1
fi
exit 0
