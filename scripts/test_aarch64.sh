#!/usr/bin/env bash
# ringpg on Linux aarch64, checked from an x86-64 Linux machine (no Arm hardware):
#
#   bash scripts/test_aarch64.sh                         # everything below
#   bash scripts/test_aarch64.sh --build-only            # stop after the cross-build
#   bash scripts/test_aarch64.sh --compile-only-kernels  # CI: only csrc/reduce/*.cpp (seconds)
#   bash scripts/test_aarch64.sh --print-copied          # the paths stage 4 copies into the rootfs
#   bash scripts/test_aarch64.sh --print-includes        # the repository's include folders it builds with
#
# 1. tools: the cross compiler (g++-aarch64-linux-gnu), qemu-user-static and mmdebstrap,
#    installed with apt-get when missing and this runs as root.
# 2. rootfs: an arm64 Debian bookworm root filesystem of Python 3.11 and its headers,
#    extracted by mmdebstrap without running anything in it (--variant=extract).
# 3. wheels: torch's aarch64 wheel (the installed torch's release, or RINGPG_ARM_TORCH),
#    its dependencies, numpy and pytest, downloaded from PyPI for manylinux aarch64 /
#    cp311 and installed into a site-packages for the rootfs by this machine's pip.
# 4. build: every csrc/**/*.cpp compiled by aarch64-linux-gnu-g++ with the flags
#    setup.py and torch's cpp_extension use, against the wheel's headers, linked
#    against its libraries (ninja, incremental): ringpg/_C.cpython-311-aarch64-linux-gnu.so;
#    then the Python tree the emulated processes run (COPIED below) copied into the
#    rootfs's /opt/ringpg beside it.  tests/test_aarch64_tree.py (CI) checks that COPIED
#    holds every repository module that stages 5 and 6 import.
# 5. kernels: the kernel tests of tests/test_reduce_ops_and_dtypes.py under qemu-user,
#    once per emulated CPU: `max` (SVE at its default 512-bit vectors) and cortex-a57
#    (no SVE): every kernel copy each CPU offers, compared with torch, and the copies
#    found; then the SVE copy again at 128- and 2048-bit vectors.
# 6. smoke: scripts/aarch64_smoke.py at 2 and 3 ranks, over shared memory and over TCP,
#    on the SVE kernels (what `max` dispatches to), then at 3 ranks on the NEON ones:
#    all_reduce, reduce_scatter_tensor and all_gather_into_tensor for every dtype and
#    ReduceOp of the kernels, equal to gloo's results in the same processes.
#
# Stages 5 and 6 run each process as `chroot ROOTFS qemu-aarch64-static -cpu CPU
# python3.11 ...` in a private mount namespace (/proc, /sys/fs/cgroup, /dev/shm and the
# site-packages bound in; not the rest of /sys, whose x86 CPU entries crash torch's
# aarch64 CPU probing: the rootfs has a stand-in, see "stand-ins" below), so
# no binfmt_misc registration is needed; a process spawned from inside the emulation
# must name the emulator itself (RINGPG_TEST_PYTHON), and each rank is started from
# here.  Everything downloaded or built goes to $RINGPG_ARM_CACHE (default
# ~/.cache/ringpg-aarch64, about 9 GiB): a second run reuses it and rebuilds only what
# changed.  Each stage prints its time; the summary lists them all.
#
# Environment: RINGPG_ARM_CACHE, RINGPG_ARM_TORCH (torch release), RINGPG_ARM_JOBS
# (parallel compiles, default 2), RINGPG_ARM_CPUS (space-separated qemu -cpu models for
# stage 5), RINGPG_ARM_SMOKE (space-separated TRANSPORT:WORLD_SIZE[:ISA] runs for stage 6);
# `none` skips a stage.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

# What stage 4 copies into the rootfs (/opt/ringpg), paths of the repository: the one
# list (--print-copied prints it for tests/test_aarch64_tree.py).
COPIED=(python tests benchmarks scripts devkit)
# The repository's include folders, as setup.py's CppExtension names them (csrc/shim holds
# the stand-in for a header torch's wheel does not ship): --print-includes prints them for
# tests/test_aarch64_tree.py, which holds them to setup.py's.
INCLUDES=(csrc csrc/shim)

MODE=full
case "${1:-}" in
  "") ;;
  --build-only) MODE=build ;;
  --compile-only-kernels) MODE=kernels ;;
  --print-copied) printf '%s\n' "${COPIED[@]}"; exit 0 ;;
  --print-includes) printf '%s\n' "${INCLUDES[@]}"; exit 0 ;;
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) echo "test_aarch64: unknown argument $1 (see --help)" >&2; exit 2 ;;
esac

CACHE=${RINGPG_ARM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ringpg-aarch64}
JOBS=${RINGPG_ARM_JOBS:-2}
CXX=aarch64-linux-gnu-g++
SUITE=bookworm # Debian release of the rootfs; its Python (3.11) fixes the wheels' cp311 tag
PYV=3.11
ROOTFS=$CACHE/rootfs-$SUITE
# The wheels' site-packages, kept beside the rootfs (which can be rebuilt without them)
# and bound to its /usr/local/lib/python3.X/dist-packages under emulation.
SITE=$CACHE/site-cp${PYV/./}
SITE_IN=/usr/local/lib/python$PYV/dist-packages
BUILD=$CACHE/build
# CPU-heavy work (compiles, emulation) yields to everything else on the machine.
NICE=(nice -n 19)
# The compile flags of `pip install .`: setup.py's extra_compile_args, what torch's
# cpp_extension adds (-std, the extension's defines) and Python's own (-fwrapv, -DNDEBUG,
# -O3; -g left out: debug info only).
CXXFLAGS=(-std=c++20 -O3 -fPIC -fwrapv -DNDEBUG -Wall -Wsign-compare -Wno-unused-parameter
  -fvisibility=hidden -DTORCH_API_INCLUDE_EXTENSION_H -DTORCH_EXTENSION_NAME=_C)
export TORCH_DEVICE_BACKEND_AUTOLOAD=0 # this machine's python3 must not import an installed ringpg
export PIP_ROOT_USER_ACTION=ignore     # pip installs into the cache's site-packages only

# ---------------------------------------------------------------- timing
T_ALL=$(date +%s.%N)
TIMES=()
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
begin() {
  STAGE=$1
  T_STAGE=$(date +%s.%N)
  echo "== test_aarch64: $STAGE"
}
end() {
  local t
  t=$(since "$T_STAGE")
  TIMES+=("$(printf '%-48s %7s s' "$STAGE${1:+ ($1)}" "$t")")
  echo "== test_aarch64: $STAGE${1:+ ($1)}: $t s"
}
summary() {
  local rc=$?
  if [ ${#TIMES[@]} -gt 0 ]; then
    echo "== test_aarch64: stage times"
    printf '   %s\n' "${TIMES[@]}"
    echo "   total $(since "$T_ALL") s ($([ $rc = 0 ] && echo passed || echo "FAILED, rc=$rc"))"
  fi
}
trap summary EXIT

die() {
  echo "test_aarch64: $*" >&2
  exit 1
}

# ---------------------------------------------------------------- 1. tools
APT_UPDATED=0
# Installs the Debian packages whose commands are missing; returns 1 if it cannot.
ensure_commands() { # cmd=package ...
  local missing=() pair
  for pair in "$@"; do
    command -v "${pair%%=*}" >/dev/null 2>&1 || missing+=("${pair#*=}")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "test_aarch64: missing ${missing[*]}: install them (apt-get install ${missing[*]})" >&2
    return 1
  fi
  echo "test_aarch64: installing ${missing[*]}"
  if [ $APT_UPDATED = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null || return 1
    APT_UPDATED=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || return 1
}

# The host torch's headers are the same files as the aarch64 wheel's (one release), so the
# kernels' translation unit needs no download: seconds, for CI.
compile_kernels_only() {
  begin "tools"
  if ! ensure_commands "$CXX=g++-aarch64-linux-gnu"; then
    end "skipped"
    echo "test_aarch64: SKIPPED the aarch64 kernel compile: no cross compiler"
    return 0
  fi
  end
  begin "cross-compile csrc/reduce"
  local torch_dir
  torch_dir=$(python3 -c "import importlib.util; print(importlib.util.find_spec('torch').submodule_search_locations[0])")
  KTMP=$(mktemp -d)
  trap 'rm -rf "$KTMP"; summary' EXIT
  for src in csrc/reduce/*.cpp; do
    "${NICE[@]}" "$CXX" "${CXXFLAGS[@]}" -Werror "${INCLUDES[@]/#/-I}" -I"$torch_dir/include" \
      -I"$torch_dir/include/torch/csrc/api/include" -c "$src" -o "$KTMP/$(basename "$src" .cpp).o"
  done
  # Each aarch64 copy of the kernels must be in the object, not silently left out.
  local syms
  syms=$(aarch64-linux-gnu-nm -C "$KTMP"/*.o)
  for copy in isa_baseline isa_neon isa_sve; do
    grep -q "ringpg::$copy::detail::reduceImpl" <<<"$syms" || die "$copy: no kernels compiled"
  done
  end "baseline, neon, sve"
}

if [ $MODE = kernels ]; then
  compile_kernels_only
  exit 0
fi

begin "tools"
ensure_commands "$CXX=g++-aarch64-linux-gnu" qemu-aarch64-static=qemu-user-static mmdebstrap=mmdebstrap \
  unshare=util-linux || die "cannot install the tools"
command -v ninja >/dev/null 2>&1 || python3 -m pip install -q ninja
TORCH_VERSION=${RINGPG_ARM_TORCH:-$(python3 -c "import torch; print(torch.__version__.split('+')[0])")}
mkdir -p "$CACHE"
end

# ---------------------------------------------------------------- 2. rootfs
begin "rootfs"
# Python, its headers (the build's), and the C++ runtime torch's libraries need.
ROOTFS_PKGS="python$PYV libpython$PYV-dev libstdc++6 libgcc-s1"
if [ "$(cat "$ROOTFS/.ringpg-rootfs" 2>/dev/null)" != "$SUITE $ROOTFS_PKGS" ]; then
  rm -rf "$ROOTFS"
  "${NICE[@]}" mmdebstrap --quiet --variant=extract --arch=arm64 --include="${ROOTFS_PKGS// /,}" \
    "$SUITE" "$ROOTFS" http://deb.debian.org/debian
  echo "$SUITE $ROOTFS_PKGS" >"$ROOTFS/.ringpg-rootfs"
  end "built"
else
  end "cached"
fi
# Mount points of the emulated processes (see emulate).
mkdir -p "$ROOTFS/proc" "$ROOTFS/sys/fs/cgroup" "$ROOTFS/dev/shm" "$ROOTFS/root" "$ROOTFS/tmp" "$ROOTFS$SITE_IN"
chmod 1777 "$ROOTFS/tmp"
# Stand-ins for what torch's CPU probing (the cpuinfo library) reads beyond HWCAP: qemu-user 7.2 shows
# the host's x86 /proc/cpuinfo, and this machine's /sys/devices/system/cpu crashes the
# probe, without which torch's thread pool refuses to start ("Failed to initialize
# cpuinfo!").  So the emulated processes see this machine's CPU count as aarch64 cores
# (Neoverse N1 ids; the instruction sets come from the emulated CPU's HWCAP regardless).
CPU_LIST="0-$(($(nproc) - 1))"
mkdir -p "$ROOTFS/sys/devices/system/cpu"
echo "$CPU_LIST" >"$ROOTFS/sys/devices/system/cpu/possible"
echo "$CPU_LIST" >"$ROOTFS/sys/devices/system/cpu/present"
for ((cpu = 0; cpu < $(nproc); cpu++)); do
  printf 'processor\t: %d\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd cpuid\nCPU implementer\t: 0x41\n' "$cpu"
  printf 'CPU architecture: 8\nCPU variant\t: 0x3\nCPU part\t: 0xd0c\nCPU revision\t: 1\n\n'
done >"$ROOTFS/etc/ringpg-emulated-cpuinfo"
cp -f "$(command -v qemu-aarch64-static)" "$ROOTFS/usr/bin/qemu-aarch64-static"

# ---------------------------------------------------------------- 3. wheels
begin "wheels"
PLATFORMS=()
for glibc in $(seq 28 -1 17); do # the rootfs's glibc is 2.36; wheels name the oldest they need
  PLATFORMS+=(--platform "manylinux_2_${glibc}_aarch64")
done
PLATFORMS+=(--platform manylinux2014_aarch64 --python-version "$PYV" --implementation cp
  --abi "cp${PYV/./}" --only-binary=:all:)
WANT="torch==$TORCH_VERSION numpy pytest pytest-timeout"
if [ "$(cat "$SITE/.ringpg-site" 2>/dev/null)" != "$WANT" ]; then
  mkdir -p "$CACHE/wheels"
  # torch's aarch64 wheel is built with CUDA: it loads the nvidia-* libraries at import,
  # so its dependencies come too (about 3 GiB; kept in $CACHE/wheels).
  python3 -m pip download -q "${PLATFORMS[@]}" -d "$CACHE/wheels" $WANT
  rm -rf "$SITE"
  "${NICE[@]}" python3 -m pip install -q --no-index --find-links "$CACHE/wheels" "${PLATFORMS[@]}" \
    --target "$SITE" $WANT
  echo "$WANT" >"$SITE/.ringpg-site"
  end "torch $TORCH_VERSION installed"
else
  end "torch $TORCH_VERSION cached"
fi
TORCH_DIR=$SITE/torch
ARM_TORCH_VERSION=$(sed -n "s/^__version__ = '\(.*\)'.*/\1/p" "$TORCH_DIR/version.py")

# ---------------------------------------------------------------- 4. build
begin "cross-build"
EXT=_C.cpython-${PYV/./}-aarch64-linux-gnu.so
mkdir -p "$BUILD"
{
  echo "# Generated by scripts/test_aarch64.sh"
  echo "cxx = $CXX"
  echo "cflags = ${CXXFLAGS[*]} ${INCLUDES[*]/#/-I$REPO/} -I$TORCH_DIR/include -I$TORCH_DIR/include/torch/csrc/api/include" \
    "-I$ROOTFS/usr/include/python$PYV -idirafter $ROOTFS/usr/include"
  # The wheel's CUDA libraries are DT_NEEDED by torch's: -rpath-link lets the linker see them.
  echo "ldflags = -shared -L$TORCH_DIR/lib -lc10 -ltorch -ltorch_cpu -ltorch_python" \
    "$(for d in "$TORCH_DIR/lib" "$SITE"/nvidia/*/lib "$SITE"/nvidia/*/*/lib; do [ -d "$d" ] && printf -- '-Wl,-rpath-link,%s ' "$d"; done)"
  echo "rule cxx"
  echo "  command = \$cxx -MMD -MF \$out.d \$cflags -c \$in -o \$out"
  echo "  depfile = \$out.d"
  echo "  deps = gcc"
  echo "  description = CXX \$in"
  echo "rule link"
  echo "  command = \$cxx \$in -o \$out \$ldflags"
  echo "  description = LINK \$out"
  objs=()
  while IFS= read -r src; do
    obj=obj/${src%.cpp}.o
    objs+=("$obj")
    echo "build $obj: cxx $REPO/$src"
  done < <(find csrc -name '*.cpp' | sort)
  echo "build $EXT: link ${objs[*]}"
} >"$BUILD/build.ninja"
"${NICE[@]}" ninja -C "$BUILD" -j "$JOBS" --quiet
file "$BUILD/$EXT" | grep -q "ARM aarch64" || die "$BUILD/$EXT is not an aarch64 shared object"
end "$(ls "$BUILD"/obj/csrc/*/*.o | wc -l) objects"

# The tree the emulated processes see: the sources' Python parts and the aarch64 build.
DEST=$ROOTFS/opt/ringpg
rm -rf "$DEST"
mkdir -p "$DEST"
cp -a "${COPIED[@]}" "$DEST/"
rm -f "$DEST"/python/ringpg/_C*.so "$DEST"/python/ringpg/.C.so.tmp
find "$DEST" -name __pycache__ -prune -exec rm -rf {} +
cp "$BUILD/$EXT" "$DEST/python/ringpg/"
printf '"""Written by scripts/test_aarch64.sh: the torch this aarch64 build is compiled for."""\nTORCH_VERSION = %s\n' \
  "'$ARM_TORCH_VERSION'" >"$DEST/python/ringpg/_build_config.py"
[ $MODE = build ] && exit 0

# ---------------------------------------------------------------- emulation
QEMU_IN=/usr/bin/qemu-aarch64-static
CHROOT=$(command -v chroot)
# Runs a command of the rootfs under qemu-user with `-cpu $1`, in the environment of the
# NAME=VALUE words before `--` plus PATH, HOME and PYTHONPATH (nothing else of ours).
emulate() {
  local cpu=$1 vars=()
  shift
  while [ "$1" != -- ]; do vars+=("$1"); shift; done
  shift
  unshare --mount --propagation private -- /bin/sh -c '
    r=$1 site=$2 site_in=$3; shift 3
    mount -t proc proc "$r/proc" && mount --bind "$r/etc/ringpg-emulated-cpuinfo" "$r/proc/cpuinfo" &&
      mount --bind /sys/fs/cgroup "$r/sys/fs/cgroup" &&
      mount --bind /dev/shm "$r/dev/shm" &&
      mount --bind "$site" "$r$site_in" || exit 1
    exec "$@"' sh "$ROOTFS" "$SITE" "$SITE_IN" \
    env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root LANG=C.UTF-8 PYTHONPATH=/opt/ringpg/python \
    PYTHONDONTWRITEBYTECODE=1 "${vars[@]}" "$CHROOT" "$ROOTFS" "$QEMU_IN" -cpu "$cpu" "$@"
}

# ---------------------------------------------------------------- 5. kernels
# Every test on `max` (SVE, NEON, baseline) and cortex-a57 (NEON, baseline); at the other
# SVE vector lengths only the SVE copy's comparisons with torch (the rest does not
# depend on the vector length).  Each CPU's expected copies, best first, are checked.
CPUS=${RINGPG_ARM_CPUS:-"max cortex-a57 max,sve-default-vector-length=16 max,sve-default-vector-length=256"}
[ "$CPUS" = none ] && CPUS=
# The kernel tests by name: the rest of their file runs groups of ranks, which are started
# from here under emulation (stage 6), not by pytest inside it.
KERNEL_TESTS=()
for t in test_kernels_match_torch test_in_place_accumulate_and_dispatch_name test_unsupported_pairs_are_refused \
  test_reduce_isa_setting_pins_a_copy_or_is_refused test_copies_found_for_this_cpu; do
  KERNEL_TESTS+=("/opt/ringpg/tests/test_reduce_ops_and_dtypes.py::$t")
done
for cpu in $CPUS; do
  case $cpu in
    max* | a64fx*) expect=sve,neon,baseline ;;
    *) expect=neon,baseline ;;
  esac
  select=()
  case $cpu in *sve-default-vector-length*) select=(-k "match_torch and sve") ;; esac
  begin "kernels -cpu $cpu"
  emulate "$cpu" RINGPG_TEST_PYTHON="$QEMU_IN -cpu $cpu /usr/bin/python$PYV" RINGPG_TEST_EXPECT_ISAS=$expect -- \
    "/usr/bin/python$PYV" -m pytest -q -p no:cacheprovider --timeout=1800 "${select[@]}" \
    "${KERNEL_TESTS[@]}" || die "kernel tests failed under -cpu $cpu"
  end "$expect"
done

# ---------------------------------------------------------------- 6. smoke
free_port() { python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }
SMOKE=${RINGPG_ARM_SMOKE:-"shm:2 tcp:2 shm:3 tcp:3 shm:3:neon"}
[ "$SMOKE" = none ] && SMOKE=
for run in $SMOKE; do
  IFS=: read -r transport ws isa <<<"$run"
  begin "smoke $transport ws=$ws${isa:+ $isa}"
  port=$(free_port)
  logs=$(mktemp -d)
  pids=()
  for ((rank = 0; rank < ws; rank++)); do
    emulate max RANK=$rank WORLD_SIZE=$ws MASTER_PORT=$port RINGPG_TRANSPORT=$transport \
      RINGPG_TUNING="reduce_isa=${isa:-auto},segment_bytes=65536,oneshot_bytes=4096" \
      GLOO_SOCKET_IFNAME=lo TORCH_INCLUDE_STACK_TRACE=0 -- \
      "/usr/bin/python$PYV" /opt/ringpg/scripts/aarch64_smoke.py >"$logs/rank$rank.log" 2>&1 &
    pids+=($!)
  done
  failed=0
  for pid in "${pids[@]}"; do
    wait "$pid" || failed=1
  done
  for ((rank = 0; rank < ws; rank++)); do
    if [ $failed = 1 ]; then tail -n 30 "$logs/rank$rank.log"; else grep "aarch64 smoke" "$logs/rank$rank.log"; fi
  done
  rm -rf "$logs"
  [ $failed = 0 ] || die "smoke run $transport ws=$ws failed"
  end
done
