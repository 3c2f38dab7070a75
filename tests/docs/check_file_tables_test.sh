#!/bin/sh
# check-file-tables.py on temp trees (not git work trees): a complete table passes; a
# source file missing from its README's table, a file of a subfolder without its own
# README, a README naming a file that does not exist, and a source file no README covers
# each fail, and the message names the file.
# Usage: check_file_tables_test.sh PATH/TO/check-file-tables.py
set -eu
check=$1
py=/usr/bin/python3
[ -x "$py" ] || py=python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM

tree() {  # a fresh tree: lib/ with a README covering lib/ and lib/sub/
  rm -rf "$tmp/t"
  mkdir -p "$tmp/t/lib/sub"
  : > "$tmp/t/lib/a.cc"; : > "$tmp/t/lib/a.h"; : > "$tmp/t/lib/sub/b.py"
  printf '%s\n' '# lib/' '| file | job |' '|---|---|' '| `a.{h,cc}` | a |' \
    '| `sub/b.py` | b |' > "$tmp/t/lib/README.md"
}

expect_fail() {  # $1: what the message must name
  if "$py" "$check" "$tmp/t" > "$tmp/out" 2>&1; then
    echo "not refused: $2"; cat "$tmp/out"; exit 1
  fi
  if ! grep -q "$1" "$tmp/out"; then
    echo "refused without naming $1: $2"; cat "$tmp/out"; exit 1
  fi
}

tree
"$py" "$check" "$tmp/t" || { echo "a complete table was refused"; exit 1; }

tree; : > "$tmp/t/lib/c.sh"
expect_fail "lib/c.sh: not in lib/README.md" "a file missing from the table"

tree; : > "$tmp/t/lib/sub/d.h"
expect_fail "lib/sub/d.h: not in lib/README.md" "a subfolder's file missing from the parent's table"

tree; echo '| `gone.cc` | removed |' >> "$tmp/t/lib/README.md"
expect_fail "mentions \`gone.cc\`, which does not exist" "a table naming a file that does not exist"

tree; mkdir -p "$tmp/t/other"; : > "$tmp/t/other/e.cc"
expect_fail "other/e.cc: no folder README covers it" "a folder without a README"

echo "ok: a complete table accepted, four mismatches refused"
