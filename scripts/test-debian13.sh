#!/usr/bin/env bash
# Builds this tree in a Debian 13 (trixie) root and runs its GoogleTest and pytest suites
# there through ctest (PyTorch 2.6, Gloo 2023-12, DPDK 24.11, Python 3.13), from a
# Debian 12 host, as root.
#
# The root is made with mmdebstrap from the Debian archive and cached in
# $OPTIREDUCE_DEB13_CACHE (default /var/cache/optireduce) under a name that hashes the
# package list, so it is made again only when the list changes. The tree is bind-mounted
# read-only at /src; the build directory (/build) and a ccache (/ccache) live beside the
# root in the cache. Everything runs in new mount, PID and network namespaces
# (unshare --kill-child): the mounts, every process the tests start and every veth or
# network namespace they make go away with them, also when this script is killed; the
# trap below ends that namespace on any exit.
#
# Usage: scripts/test-debian13.sh [ctest args...]    e.g. -R python_ -j2
#        scripts/test-debian13.sh --exec CMD [args...]  runs CMD in the root instead (in
#        /build, same mounts; no build, no tests), e.g. to look at a failure
# Prints the time spent making the root, building and testing.
set -euo pipefail
main() {
cd "$(dirname "$0")/.."
SRC=$(pwd)

if [ "$(id -u)" -ne 0 ]; then
  echo "test-debian13: needs root (mmdebstrap, chroot, namespaces)" >&2
  exit 1
fi

# The build and test dependencies of scripts/install-deps.sh, as named in trixie, and
# ccache for rebuilds.
PACKAGES=(
  build-essential cmake ninja-build pkg-config git iproute2 procps file ccache
  libgloo-dev libhiredis-dev libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev
  dpdk-dev libdpdk-dev libbpf-dev libxdp-dev clang
  libtorch-dev python3-torch python3-pytest python3-redis python3-matplotlib python3-sklearn
  redis-server
)
SUITE=trixie
MIRROR=http://deb.debian.org/debian
CACHE=${OPTIREDUCE_DEB13_CACHE:-/var/cache/optireduce}
KEY=$(printf '%s\n' "$SUITE" "$MIRROR" "${PACKAGES[@]}" | sha256sum | cut -c1-16)
ROOT=$CACHE/debian13-$KEY
BUILD=$CACHE/debian13-$KEY-build
CCACHE=$CACHE/debian13-ccache
JOBS=${OPTIREDUCE_DEB13_JOBS:-2}

now() { date +%s; }
t_root=0 t_build=0 t_test=0

ns_pid=""
cleanup() {
  local rc=$?
  if [ -n "$ns_pid" ] && kill -0 "$ns_pid" 2>/dev/null; then
    kill -KILL "$ns_pid" 2>/dev/null || true
    wait "$ns_pid" 2>/dev/null || true
  fi
  rm -rf "$ROOT.new"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# 1. The root (cached).
if [ ! -f "$ROOT/.optireduce-ready" ]; then
  if ! command -v mmdebstrap >/dev/null; then
    echo "test-debian13: installing mmdebstrap" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap >&2
  fi
  mkdir -p "$CACHE"
  # Roots and build trees of other package lists are stale.
  for old in "$CACHE"/debian13-*; do
    case "$old" in "$ROOT"|"$BUILD"|"$CCACHE") ;; *) rm -rf "$old" ;; esac
  done
  rm -rf "$ROOT" "$ROOT.new" "$BUILD"
  echo "test-debian13: making the $SUITE root $ROOT (several minutes)" >&2
  t0=$(now)
  include=$(IFS=,; echo "${PACKAGES[*]}")
  mmdebstrap --quiet --variant=apt --include="$include" "$SUITE" "$ROOT.new" "$MIRROR"
  mkdir -p "$ROOT.new/src" "$ROOT.new/build" "$ROOT.new/ccache"
  touch "$ROOT.new/.optireduce-ready"
  mv "$ROOT.new" "$ROOT"
  t_root=$(( $(now) - t0 ))
fi
mkdir -p "$BUILD" "$CCACHE"

# 2. Inside new namespaces: mounts, then build and test in the root. The inner script
# writes each stage's time to /build/.stage-times.
inner=$(cat <<'EOF'
set -euo pipefail
ROOT=$1 SRC=$2 BUILD=$3 CCACHE=$4 JOBS=$5; shift 5
# "/" of the root is a mount point (ip netns needs it), then the file systems on top.
mount --bind "$ROOT" "$ROOT"
mount --bind "$SRC" "$ROOT/src"
mount -o remount,bind,ro "$ROOT/src"
mount --bind "$BUILD" "$ROOT/build"
mount --bind "$CCACHE" "$ROOT/ccache"
mount -t proc proc "$ROOT/proc"
mount -t sysfs sysfs "$ROOT/sys"
mount -t bpf bpf "$ROOT/sys/fs/bpf" 2>/dev/null || true
mount --rbind /dev "$ROOT/dev"
mount -t tmpfs -o mode=1777 tmpfs "$ROOT/dev/shm"
mount -t tmpfs -o mode=755 tmpfs "$ROOT/run"
mount -t tmpfs -o mode=1777 tmpfs "$ROOT/tmp"
ip link set lo up
exec chroot "$ROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
  LANG=C.UTF-8 CCACHE_DIR=/ccache CCACHE_BASEDIR=/src UCX_LOG_LEVEL=fatal \
  JOBS="$JOBS" /bin/bash -c '
set -euo pipefail
if [ "${1:-}" = --exec ]; then shift; cd /build; exec "$@"; fi
t0=$(date +%s)
cmake -S /src -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache >/dev/null
cmake --build /build -j "$JOBS"
t1=$(date +%s)
echo "build $((t1 - t0))" > /build/.stage-times
cd /build
rc=0
ctest --output-on-failure --timeout 900 "$@" || rc=$?
echo "test $(( $(date +%s) - t1 ))" >> /build/.stage-times
exit $rc
' inner "$@"
EOF
)
[ "${1:-}" = --exec ] || rm -f "$BUILD/.stage-times"
rc=0
unshare --mount --propagation private --pid --net --fork --kill-child \
  /bin/bash -c "$inner" inner "$ROOT" "$SRC" "$BUILD" "$CCACHE" "$JOBS" "$@" &
ns_pid=$!
wait "$ns_pid" || rc=$?
ns_pid=""
if [ "${1:-}" = --exec ]; then
  exit $rc
fi
if [ -f "$BUILD/.stage-times" ]; then
  t_build=$(awk '$1=="build"{print $2}' "$BUILD/.stage-times")
  t_test=$(awk '$1=="test"{print $2}' "$BUILD/.stage-times")
fi
echo "test-debian13: root ${t_root:-0} s (0: cached), build ${t_build:-?} s," \
     "tests ${t_test:-?} s; exit $rc" >&2
exit $rc
}
# Wrapped in main so that editing this file while it runs cannot change what runs.
main "$@"
exit
