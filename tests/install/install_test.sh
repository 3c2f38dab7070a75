#!/bin/sh
# cmake --install of this build into a temporary prefix, then a separate project that finds
# it with find_package(optireduce), builds, and runs (README "C++ with Gloo").
# Usage: install_test.sh BUILD_DIR CONSUMER_SOURCE_DIR
set -eu
build=$1
consumer=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
cmake --install "$build" --prefix "$tmp/prefix" > "$tmp/install.log"
test -f "$tmp/prefix/include/optireduce/algorithms/allreduce.h"
test ! -e "$tmp/prefix/include/optireduce/algorithms/internal"
# Shared headers come along; the path model (a test simulator) stays out of the package.
test -f "$tmp/prefix/include/optireduce/common/counter_list.h"
test ! -e "$tmp/prefix/include/optireduce/transport_dpdk/reliable/path_model.h"
cmake -S "$consumer" -B "$tmp/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" \
  -DCMAKE_BUILD_TYPE=Release > "$tmp/configure.log"
cmake --build "$tmp/build" > "$tmp/build.log"
LD_LIBRARY_PATH="$tmp/prefix/lib:${LD_LIBRARY_PATH:-}" "$tmp/build/consumer"
