#!/bin/sh
# check-docs.sh refuses each work-log line below (one file each) and accepts a reference
# line. Usage: check_docs_test.sh PATH/TO/check-docs.sh
# (A number written @N@ below becomes N when the line is tested, so that this file itself
# holds no work-log reference.)
set -eu
check=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
n=0
while IFS= read -r line; do
  n=$((n + 1))
  line=$(printf '%s\n' "$line" | sed 's/@\([0-9]*\)@/\1/g')
  printf '%s\n' "$line" > "$tmp/bad$n.md"
  if "$check" "$tmp/bad$n.md" > /dev/null 2>&1; then
    echo "not refused: $line"
    exit 1
  fi
done <<'LINES'
### Session @9@ (tail ratio): ranks pinned
measured in sessions @3@-5 on the VM
as issue @5@ suggests, a limit for abnormal loss
// OptiReduce mode's benchmark (issue #@5@)
Tried and not kept: giving a straggler up at once.
Engine changes (tried locally, not committed)
## Verification (2026-11-30)
## Results for #12
- **(b) holds** under loss
Three back-to-back runs (load average @2@.4-3.8)
measured at load ~@5@ on this host
What changed since the run above (each step measured alone)
frames duplicated in our runs
LINES
printf '%s\n' "The tail ratio p99/p50 of 16 MiB allreduces (bench/RESULTS.md)." > "$tmp/good.md"
"$check" "$tmp/good.md"
echo "ok: $n work-log lines refused, a reference line accepted"
