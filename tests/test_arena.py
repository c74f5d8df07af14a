"""The host arena: a group on one host shares one shared-memory segment, and its
collectives run over it in one or two steps at any rank count (csrc/transport/arena.h,
csrc/algorithms/arena_collectives.h); and the one function that chooses every op's
algorithm (csrc/algorithms/choice.h).

* The choice, asked about every group shape of 1 to 64 ranks (no process started):
  the arena where the group has one, the links' algorithms where it has none, the
  one-shot where what each member reads of the others is small.
* Each host collective (allreduce one-shot and in two steps, reduce-scatter,
  all-gather, broadcast from every root, reduce, gather and scatter, all-to-all even,
  uneven, in place and as lists, barrier) at 1 to 9
  ranks on the host, against gloo in the same processes: every dtype and ReduceOp,
  sizes of 0, 1, fewer elements than ranks, odd, and across many pieces of a small
  buffer (``RINGPG_ARENA_BYTES=8192``, so that every buffer parity is reused many times).
* Its set-up: no segment is left in /dev/shm once a group is up; a segment a crashed
  job left is unlinked by the next group; a /dev/shm too small for the arena leaves
  the group on its links, on every rank alike, saying why and naming the setting.
* Failures: a rank that dies inside a host collective fails every other rank within
  seconds, and one that freezes, at the op's deadline, each naming the op and a rank.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from typing import Any

import harness
import pytest
import torch
import torch.distributed as dist
from harness import (
    DTYPES,
    OPS,
    Checker,
    CheckReport,
    Groups,
    InitSpec,
    WorkerPool,
    assert_reports_ok,
    data_kind,
    dtype_name,
    make_data,
    reduce_op,
    ref_all_gather,
    ref_all_reduce,
    ref_all_reduce_many,
    ref_broadcast,
    ref_reduce_scatter,
    run_scenario,
    sentinel_like,
)
from harness.scenarios import KILL_DETECT_S, expect_error, init_ringpg
from harness.transports import a2a_split

from devkit.settings import merged_env, tuning_value

try:
    import ringpg._C as _C
except ModuleNotFoundError:
    _C = None

needs_C = pytest.mark.skipif(_C is None, reason="could not import 'ringpg._C'")
ringpg_only = harness.ringpg_only("ringpg's own arena")

COLLECTIVES = (
    "allreduce",
    "reduce_scatter",
    "all_gather",
    "broadcast",
    "reduce",
    "barrier",
    "gather",
    "scatter",
    "all_to_all",
)
NO_BYTES = ("barrier", "all_to_all")  # chosen on the group alone: ranks' splits differ
ARENA = ("arena", "arena_oneshot")
# What the links run for an op that is not the ring's (every other: "ring").
LINKS_ALGORITHM = {"broadcast": "chain", "gather": "direct", "scatter": "direct", "all_to_all": "direct"}


# ============================================= the choice, every shape of 1 to 64 ranks


def _choose(op: str, size: int, nbytes: int, arena: bool = True, algo: str = "auto", **shape: Any) -> str:
    """The algorithm of the op's plan (choice.h) in a one-host group of ``size`` unless ``shape`` says."""
    kw: dict[str, Any] = {"ring_fused": size > 1}
    kw.update(shape)
    return _C.plan_op(op=op, size=size, nbytes=nbytes, arena=arena, algo=algo, **kw)["algorithm"]


@pytest.mark.inprocess
@needs_C
@pytest.mark.parametrize("size", range(1, 65))
def test_the_arena_serves_every_op_of_a_group_on_one_host(size: int) -> None:
    volume = _C.arena_oneshot_volume()
    for nbytes in (4, 4096, 65536, 1 << 20, 1 << 26):
        for op in COLLECTIVES:
            got = _choose(op, size, 0 if op in NO_BYTES else nbytes)
            if size == 1:
                assert got == "local", (op, size, nbytes, got)
                continue
            small = nbytes * (size - 1) <= volume
            if op in ("allreduce", "reduce"):
                if size == 2:
                    # Two ranks: the links' own exchange (one-shot, or the ring's two steps).
                    assert got in ("oneshot", "ring"), (op, size, nbytes, got)
                elif small:
                    # One step: every member reduces what every member wrote.
                    assert got == "arena_oneshot", (op, size, nbytes, got)
                else:
                    assert got == "arena", (op, size, nbytes, got)
            elif op == "all_to_all":
                # From three ranks; at two, every block over the one link between them.
                assert got == ("arena" if size > 2 else "direct"), (op, size, nbytes, got)
            elif size == 2 and op in ("reduce_scatter", "all_gather"):
                # Two ranks: the arena's band, then one message each way (the next tests).
                assert got == _two_ranks(op, nbytes, arena=True, lends=False), (op, size, nbytes, got)
            elif size > 2 or small or op == "barrier":
                assert got == "arena", (op, size, nbytes, got)
            else:
                assert got == LINKS_ALGORITHM.get(op, "ring"), (op, size, nbytes, got)
            # Asked for, the arena takes every size, two ranks too.
            forced = _choose(op, size, 0 if op in NO_BYTES else nbytes, algo="arena")
            assert forced in ARENA, (op, size, nbytes, forced)


def _two_ranks(op: str, nbytes: int, arena: bool, lends: bool) -> str:
    """What a two-rank reduce-scatter or all-gather of ``nbytes`` (input, output) runs on one
    host's shared-memory link, host tensors, the choice left to ringpg (choice.h): the arena
    up to arena_pair_bytes, then the pair; a reduce-scatter's up to lent_reduce_from (the
    ring's lent reduce step from there), an all-gather's where it is small enough to copy
    through the slots or its size class lends (else the arena up to its two-rank reach,
    then the ring)."""
    if arena and nbytes <= _C.arena_pair_bytes():
        return "arena"
    if op == "reduce_scatter":
        return "pair" if nbytes < _C.lent_reduce_from() else "ring"
    if nbytes <= _C.pair_copied_most_bytes() or lends:
        return "pair"
    return "arena" if arena and nbytes <= _C.arena_pair_all_gather_bytes() else "ring"


@pytest.mark.inprocess
@needs_C
@pytest.mark.parametrize("op", ["reduce_scatter", "all_gather"])
@pytest.mark.parametrize("cached,streaming", [(False, False), (True, False), (False, True), (True, True)])
def test_two_ranks_reduce_scatter_and_gather_as_a_pair(op: str, cached: bool, streaming: bool) -> None:
    """Two ranks on one host's shared-memory link: past the arena's two-rank band a
    reduce-scatter or an all-gather is one message each way (``pair``) -- a reduce-scatter
    below the size from which the ring lends its reduce step, an all-gather where it is
    small enough to copy or its size class lends (single copy), else the arena to its
    two-rank reach and the ring past it; the pair lends exactly where it is past the
    copied band and its class lends.  The ring for several hosts, three ranks without an
    arena, links that do not fuse, a set algorithm; device tensors staged in pieces on the
    staged ring, smaller ones as host tensors."""
    copy = {"copy_cached": cached, "copy_streaming": streaming}
    band, copied, reach = _C.arena_pair_bytes(), _C.pair_copied_most_bytes(), _C.arena_pair_all_gather_bytes()
    lent, big = _C.lent_reduce_from(), _C.streaming_op_bytes()
    sizes = (4096, band, band + 4, copied, copied + 4, reach, reach + 4, 1 << 20, lent - 4, lent, big, 1 << 26)
    for nbytes in sizes:
        lends = _C.single_copy_for(cached, streaming, nbytes)
        for arena in (True, False):
            got = _choose(op, 2, nbytes, arena=arena, **copy)
            assert got == _two_ranks(op, nbytes, arena, lends), (op, nbytes, arena, got)
            plan = _C.plan_op(op=op, size=2, nbytes=nbytes, arena=arena, ring_fused=True, **copy)
            if got == "pair":
                assert plan["lends"] == (nbytes > copied and lends), (op, nbytes, plan)
        assert _choose(op, 2, nbytes, arena=False, algo="ring", **copy) == "ring"
        assert _choose(op, 2, nbytes, arena=False, ring_fused=False, **copy) == "ring"
        assert _choose(op, 3, nbytes, arena=False, **copy) == "ring"
        assert _choose(op, 2, nbytes, arena=False, hosts=2, most_per_host=1, **copy) == "ring"
        staged = nbytes >= _C.staged_min_bytes()
        on_device = "staged_ring" if staged else _two_ranks(op, nbytes, arena=False, lends=lends)
        assert _choose(op, 2, nbytes, arena=False, device=True, **copy) == on_device


@pytest.mark.inprocess
@needs_C
@pytest.mark.parametrize("size", range(1, 65))
def test_without_an_arena_the_links_algorithms_run_as_before(size: int) -> None:
    limit = int(tuning_value("oneshot_bytes", {}))  # the default
    for nbytes in (4, 4096, 65536, limit, limit + 4, 2 * limit, 2 * limit + 4, 1 << 20):
        got = _choose("allreduce", size, nbytes, arena=False, ring_fused=False)
        if size == 1:
            assert got == "local"
        elif size == 2 and nbytes <= 2 * limit:
            assert got == "oneshot", (size, nbytes, got)  # two ranks: the volume counts half
        elif size <= 8 and nbytes * (size - 1) <= limit:
            assert got == "oneshot", (size, nbytes, got)
        elif size > 8 and nbytes * (size - 1).bit_length() <= limit:
            assert got == "doubling", (size, nbytes, got)
        else:
            assert got == "ring", (size, nbytes, got)
        # On one host's shared-memory ring past two ranks the one-shot would cross TCP.
        fused = _choose("allreduce", size, nbytes, arena=False)
        assert fused == ("local" if size == 1 else "oneshot" if got == "oneshot" and size == 2 else "ring"), (
            size,
            nbytes,
            fused,
        )
        for op in COLLECTIVES[1:]:
            if op == "all_to_all":
                # Every pair below 512 ranks (RINGPG_TUNING alltoall=auto), Bruck's from 512.
                assert _choose(op, size, 0, arena=False) == ("local" if size == 1 else "direct"), size
                assert _choose(op, 512, 0, arena=False) == "bruck"
                continue
            if op == "barrier":
                # A token's allreduce: one byte where the one-shot or doubling carries it.
                want = _choose("allreduce", size, 1, arena=False)
                assert _choose(op, size, nbytes, arena=False) == want, (size, want)
                assert _choose(op, size, nbytes, arena=False, ring_fused=False) == (
                    _choose("allreduce", size, 1, arena=False, ring_fused=False)
                ), size
                continue
            want = "local" if size == 1 else LINKS_ALGORITHM.get(op, "ring")
            if op in ("reduce_scatter", "all_gather") and size == 2:
                want = _two_ranks(op, nbytes, arena=False, lends=False)  # two ranks: one message each way
            assert _choose(op, size, nbytes, arena=False) == want, (op, size)
            if op in ("reduce_scatter", "all_gather"):  # links that do not fuse their receives: the ring
                assert _choose(op, size, nbytes, arena=False, ring_fused=False) == ("local" if size == 1 else "ring")
    # Hosts of equal numbers of ranks: the hierarchical algorithms, never the arena.
    if size >= 4 and size % 2 == 0:
        shape = {"hosts": 2, "most_per_host": size // 2, "hierarchical": True, "ring_fused": False}
        assert _choose("allreduce", size, 1 << 26, arena=False, **shape) == "hier"
        assert _choose("reduce_scatter", size, 1 << 26, arena=False, **shape) == "hier"
        assert _choose("all_gather", size, 1 << 26, arena=False, **shape) == "hier"
        # A barrier's one byte: the one-shot, then recursive doubling, never the rings.
        assert _choose("barrier", size, 0, arena=False, **shape) == ("oneshot" if size <= 8 else "doubling")


@pytest.mark.inprocess
@needs_C
def test_large_cuda_tensors_take_the_staged_ring_or_the_arena() -> None:
    # One host of 4 or 2 ranks (_choose's shape).  With an arena (from three ranks) the large
    # allreduce runs there (staged in pieces); without, the staged ring.
    assert _choose("allreduce", 4, 1 << 26, device=True) == "arena"
    assert _choose("allreduce", 4, 1 << 26, arena=False, device=True) == "staged_ring"
    assert _choose("allreduce", 2, 1 << 26, device=True) == "staged_ring"
    # So do large reduce-scatters and all-gathers of CUDA tensors on the ring (two ranks).
    for op in ("reduce_scatter", "all_gather"):
        assert _choose(op, 2, 1 << 26, device=True) == "staged_ring"
        assert _choose(op, 2, 1 << 26) == "ring"
    # Unless device copies reach the arena's buffers directly (its segment registered with
    # the device): then two ranks' large device ops run there too, host tensors not.
    for op in ("allreduce", "reduce_scatter", "all_gather"):
        direct = {"device": True, "arena_reaches_device": True}
        assert _choose(op, 2, 1 << 26, **direct) == "arena"
        assert _choose(op, 2, 1 << 26, arena_reaches_device=True) == "ring"
        assert _choose(op, 2, 1 << 26, arena=False, **direct) == "staged_ring"
    # A small one is staged whole and runs in the arena's one step.
    assert _choose("allreduce", 4, 64, device=True) == "arena_oneshot"


@pytest.mark.inprocess
@needs_C
def test_single_copy_is_chosen_by_the_size_class_of_the_op() -> None:
    # An op below streaming_op_bytes() lends where the cached class does, one from it on
    # where the streaming class does: every combination, on both sides of the line.
    line = _C.streaming_op_bytes()
    assert line > 1 << 20
    for cached in (False, True):
        for streaming in (False, True):
            for nbytes in (0, 4096, line // 2, line - 1):
                assert _C.single_copy_for(cached, streaming, nbytes) == cached, (cached, streaming, nbytes)
            for nbytes in (line, line + 1, 64 * line):
                assert _C.single_copy_for(cached, streaming, nbytes) == streaming, (cached, streaming, nbytes)


@pytest.mark.inprocess
@needs_C
@pytest.mark.parametrize("elem", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("parts", [1, 2, 3, 7, 16, 64])
def test_an_arena_piece_fills_the_buffer_in_whole_lines(elem: int, parts: int) -> None:
    for buffer in (4096, 8192, 1 << 20, 3 * 4096):
        n = _C.arena_piece_elems(buffer, elem, parts)
        assert n >= 1 and n * elem * parts <= buffer, (buffer, elem, parts, n)
        per_line = 64 // elem
        if n >= per_line:
            assert n % per_line == 0, (buffer, elem, parts, n)
        # The largest such count: one more line would not fit.
        assert (n + per_line) * elem * parts > buffer, (buffer, elem, parts, n)


# ============================================= segment names and what a crash leaves


@pytest.mark.inprocess
@needs_C
def test_segment_names_carry_their_creators_pid() -> None:
    name = _C.arena_segment_name(4242, 0xABCDEF)
    assert name.startswith("/ringpg-arena-4242-")
    assert _C.segment_creator_pid(name[1:]) == 4242
    assert _C.segment_creator_pid("ringpg-77-1f") == 77  # the links' regions
    for other in ("ringpg-arena-x-1f", "ringpg--1f", "ringpg-12-", "ringpg-12-zz", "sem.foo", "torch_1234", ""):
        assert _C.segment_creator_pid(other) == 0, other


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.mark.multiprocess  # a child process, for the pid of a dead one
@needs_C
@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")
def test_a_segment_left_by_a_dead_creator_is_reclaimed() -> None:
    dead = _dead_pid()
    old = time.time() - 3600
    paths = {
        "dead, old": f"/dev/shm/ringpg-arena-{dead}-badc0de",
        "dead, young": f"/dev/shm/ringpg-arena-{dead}-c0ffee",
        "alive, old": f"/dev/shm/ringpg-arena-{os.getpid()}-feed",
    }
    try:
        for what, path in paths.items():
            with open(path, "wb") as f:
                f.write(b"\0" * 64)
            if "old" in what:
                os.utime(path, (old, old))
        assert _C.reclaim_stale_segments("/dev/shm", 60) >= 1
        assert not os.path.exists(paths["dead, old"])
        assert os.path.exists(paths["dead, young"])  # a group may be mapping it right now
        assert os.path.exists(paths["alive, old"])
    finally:
        for path in paths.values():
            if os.path.exists(path):
                os.unlink(path)


# ============================================= every host collective, 1 to 9 ranks

# A small buffer: the sizes below span many pieces, and every buffer is reused.
SMALL_ARENA = (("RINGPG_ALGO", "arena"), ("RINGPG_ARENA_BYTES", "8192"))
BITWISE = ("BAND", "BOR", "BXOR")


def _numels(ws: int, dtype: torch.dtype) -> list[int]:
    # 0, 1, fewer than ranks, odd, and past several pieces of 8 KiB (2048 float32s).
    ns = {0, 1, max(ws - 1, 1), ws + 1, 1001}
    if dtype in (torch.float32, torch.int32, torch.int8, torch.float64):
        ns.add(5003)
    return sorted(ns)


def _ops_for(dtype: torch.dtype) -> tuple[str, ...]:
    ops = OPS
    if not dtype.is_floating_point:
        ops += BITWISE
    return ops


def arena_battery(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    import ringpg

    chk = Checker(rank)
    test, ref = groups.test, groups.ref
    b = ringpg.backend(test)
    chk.true("the group has its arena", (b.arena_bytes > 0) == (ws > 1), f"{b.arena_bytes} {b.arena_why_not!r}")
    if ws > 1:
        for op in COLLECTIVES:
            chk.true(f"{op} runs in the arena", b.algorithm_for(op, 1 << 20) in ARENA, b.algorithm_for(op, 1 << 20))
    for dtype in DTYPES:
        ns = _numels(ws, dtype)
        tags = {n: f"dtype={dtype_name(dtype)} ws={ws} n={n}" for n in ns}
        for op in _ops_for(dtype):
            kind = data_kind(op)
            xs = {n: make_data(rank, f"ar {op} {tags[n]}", (n,), dtype, kind) for n in ns}
            fulls = {n: make_data(rank, f"rs {op} {tags[n]}", (n * ws,), dtype, kind) for n in ns}
            ys = {n: make_data(rank, f"reduce {op} {tags[n]}", (n,), dtype, kind) for n in ns}
            # gloo's results for every size at once (one call: its latency, not the data, is the cost).
            refs = iter(ref_all_reduce_many([*xs.values(), *fulls.values(), *ys.values()], op, ref))
            want_ar, want_full, want_reduce = ({n: next(refs) for n in ns} for _ in range(3))
            for n in ns:
                tag = tags[n]
                got = xs[n].clone()
                dist.all_reduce(got, op=reduce_op(op), group=test)
                chk.equal(f"all_reduce op={op} {tag}", got, want_ar[n])
                before = fulls[n].clone()
                out = sentinel_like((n,), dtype)
                dist.reduce_scatter_tensor(out, fulls[n], op=reduce_op(op), group=test)
                chk.equal(f"reduce_scatter_tensor op={op} {tag}", out, want_full[n].narrow(0, rank * n, n))
                chk.equal(f"reduce_scatter_tensor op={op} {tag} [input unchanged]", fulls[n], before)
                root = (n + len(op)) % ws
                got = ys[n].clone()
                dist.reduce(got, dst=root, op=reduce_op(op), group=test)
                if rank == root:
                    chk.equal(f"reduce op={op} root={root} {tag}", got, want_reduce[n])
        for n in ns:
            tag = tags[n]
            x = make_data(rank, f"ag {tag}", (n,), dtype)
            want = ref_all_gather(x, ref)
            out = sentinel_like((n * ws,), dtype)
            dist.all_gather_into_tensor(out, x, group=test)
            chk.equal(f"all_gather_into_tensor {tag}", out, want)
            # In place: the input is this rank's chunk of the output (FSDP's call).
            inplace = sentinel_like((n * ws,), dtype)
            inplace.narrow(0, rank * n, n).copy_(x)
            dist.all_gather_into_tensor(inplace, inplace.narrow(0, rank * n, n), group=test)
            chk.equal(f"all_gather_into_tensor in place {tag}", inplace, want)
            for root in range(ws):
                x = make_data(rank, f"bc {tag} root={root}", (n,), dtype)
                got = x.clone()
                dist.broadcast(got, src=root, group=test)
                chk.equal(f"broadcast root={root} {tag}", got, ref_broadcast(x, root, ref))
            root = (n + DTYPES.index(dtype)) % ws
            x = make_data(rank, f"gather {tag}", (n,), dtype)
            outs = [sentinel_like((n,), dtype) for _ in range(ws)] if rank == root else None
            refs = [sentinel_like((n,), dtype) for _ in range(ws)] if rank == root else None
            dist.gather(x, outs, dst=root, group=test)
            dist.gather(x, refs, dst=root, group=ref)
            for q in range(ws) if rank == root else ():
                chk.equal(f"gather root={root} from {q} {tag}", outs[q], refs[q])
            ins = [make_data(rank, f"scatter {tag} to {q}", (n,), dtype) for q in range(ws)] if rank == root else None
            got, want = sentinel_like((n,), dtype), sentinel_like((n,), dtype)
            dist.scatter(got, ins, src=root, group=test)
            dist.scatter(want, ins, src=root, group=ref)
            chk.equal(f"scatter root={root} {tag}", got, want)
            _all_to_alls(chk, rank, ws, groups, dtype, n, tag)
    # Complex tensors reduce as pairs of reals.
    z = torch.complex(make_data(rank, "z re", (333,), torch.float32), make_data(rank, "z im", (333,), torch.float32))
    got = z.clone()
    dist.all_reduce(got, group=test)
    chk.equal(f"all_reduce complex64 ws={ws}", got, ref_all_reduce(z, "SUM", ref))
    dist.barrier(group=test)
    return chk.report()


def _all_to_alls(chk: Checker, rank: int, ws: int, groups: Groups, dtype: torch.dtype, n: int, tag: str) -> None:
    """all_to_all_single with even splits (n elements a rank; and in place, against gloo's
    out-of-place result) and uneven ones (some empty), and the list form of the uneven
    blocks, against gloo."""
    test, ref = groups.test, groups.ref
    x = make_data(rank, f"a2a {tag}", (n * ws,), dtype)
    got, want = sentinel_like((n * ws,), dtype), sentinel_like((n * ws,), dtype)
    dist.all_to_all_single(got, x, group=test)
    dist.all_to_all_single(want, x, group=ref)
    chk.equal(f"all_to_all_single {tag}", got, want)
    inplace = x.clone()
    dist.all_to_all_single(inplace, inplace, group=test)
    chk.equal(f"all_to_all_single in place {tag}", inplace, want)
    ins = [a2a_split(rank, q, ws, n) for q in range(ws)]
    outs = [a2a_split(q, rank, ws, n) for q in range(ws)]
    x = make_data(rank, f"a2a uneven {tag}", (sum(ins),), dtype)
    got, want = sentinel_like((sum(outs),), dtype), sentinel_like((sum(outs),), dtype)
    dist.all_to_all_single(got, x, outs, ins, group=test)
    dist.all_to_all_single(want, x, outs, ins, group=ref)
    chk.equal(f"all_to_all_single uneven {tag}", got, want)
    # The list form, uneven (gloo's takes equal sizes only): the same blocks as tensors of their own.
    got = [sentinel_like((outs[q],), dtype) for q in range(ws)]
    dist.all_to_all(got, [b.clone() for b in x.split(ins)], group=test)
    chk.equal(f"all_to_all list uneven {tag}", torch.cat(got), want)


@pytest.mark.multiprocess
@ringpg_only
# From 4 ranks, more than 5 s each on 2 cores, and longer with every rank.
@pytest.mark.parametrize("ws", [*range(1, 4), *(pytest.param(ws, marks=pytest.mark.slow) for ws in range(4, 10))])
def test_every_host_collective_against_gloo(ws: int) -> None:
    with WorkerPool(ws, InitSpec(env=SMALL_ARENA)) as pool:
        assert_reports_ok(pool.run(arena_battery, timeout=600), min_checks_per_rank=50)


def default_arena_worker(rank: int, ws: int, groups: Groups, args: Any) -> CheckReport:
    """The default buffer and choice: large buffers in pieces of RINGPG_ARENA_BYTES."""
    import ringpg

    chk = Checker(rank)
    b = ringpg.backend(groups.test)
    chk.true("default arena", b.arena_bytes == 1 << 20, str(b.arena_bytes))
    for n in (1, 1000, (1 << 20) + 3, 3 << 20):
        for op in ("SUM", "MAX", "AVG"):
            x = make_data(rank, f"big {op} {n}", (n,), torch.float32)
            got = x.clone()
            dist.all_reduce(got, op=reduce_op(op), group=groups.test)
            chk.equal(
                f"all_reduce {op} n={n} ({b.algorithm_for('allreduce', 4 * n)})", got, ref_all_reduce(x, op, groups.ref)
            )
        full = make_data(rank, f"big rs {n}", (n * ws,), torch.int32)
        out = torch.empty(n, dtype=torch.int32)
        dist.reduce_scatter_tensor(out, full, group=groups.test)
        chk.equal(f"reduce_scatter n={n}", out, ref_reduce_scatter(full, "SUM", groups.ref))
        x = make_data(rank, f"big ag {n}", (n,), torch.bfloat16)
        out = torch.empty(n * ws, dtype=torch.bfloat16)
        dist.all_gather_into_tensor(out, x, group=groups.test)
        chk.equal(f"all_gather n={n}", out, ref_all_gather(x, groups.ref))
        x = make_data(rank, f"big bc {n}", (n,), torch.float64)
        got = x.clone()
        dist.broadcast(got, src=ws - 1, group=groups.test)
        chk.equal(f"broadcast n={n}", got, ref_broadcast(x, ws - 1, groups.ref))
    # The list form with blocks of their own, far apart in memory: those to and from rank
    # 0 on the allocator's heap, the others in shared-memory mappings of their own (far
    # from the heap), each output allocated right after its input, so outputs lie between
    # inputs and no block overlaps another; against gloo's all_to_all_single of them.
    size = lambda src, dst: 16 if 0 in (src, dst) else (1 << 16) + src  # noqa: E731
    far = lambda t: t if t.numel() == 16 else t.share_memory_()  # noqa: E731
    ins, outs = [], []
    for q in range(ws):
        ins.append(far(make_data(rank, f"far a2a to {q}", (size(rank, q),), torch.float32)))
        outs.append(far(sentinel_like((size(q, rank),), torch.float32)))
    dist.all_to_all(outs, ins, group=groups.test)
    want = sentinel_like((sum(size(q, rank) for q in range(ws)),), torch.float32)
    in_splits, out_splits = [size(rank, q) for q in range(ws)], [size(q, rank) for q in range(ws)]
    dist.all_to_all_single(want, torch.cat(ins), out_splits, in_splits, group=groups.ref)
    chk.equal("all_to_all list, blocks far apart", torch.cat(outs), want)
    return chk.report()


@pytest.mark.multiprocess
@ringpg_only
@pytest.mark.parametrize("ws", [3, 4])
def test_large_buffers_in_pieces_of_the_default_arena(ws: int) -> None:
    with WorkerPool(ws) as pool:
        assert_reports_ok(pool.run(default_arena_worker, timeout=600), min_checks_per_rank=10)


def every_member_says_worker(rank: int, ws: int, groups: Groups, args: Any) -> dict[str, Any]:
    """The agreement round the first device op runs (arenaEveryMemberSays): all say
    yes; one says no (the first rank, then the last); all again. Then an allreduce in
    the arena, against gloo: the extra rounds leave every member's round count in step."""
    import ringpg

    chk = Checker(rank)
    b = ringpg.backend(groups.test)
    said = [b._every_member_says(rank != liar) for liar in (None, 0, ws - 1, None)]
    case = f"all_reduce after the agreement rounds ws={ws}"
    x = make_data(rank, case, (4099,), torch.float32)
    got = x.clone()
    dist.all_reduce(got, group=groups.test)
    chk.equal(case, got, ref_all_reduce(x, "SUM", groups.ref))
    return {"said": said, "report": chk.report()}


@pytest.mark.multiprocess
@ringpg_only
@pytest.mark.parametrize("ws", [2, 3])
def test_every_member_learns_whether_all_said_yes(ws: int) -> None:
    """Whether the arena reaches the device must be the same on every rank (two ranks
    choose the arena or the staged ring by it): the round that agrees on it answers
    yes only where every rank said yes, the same on all."""
    results = harness.run_workers(every_member_says_worker, ws)
    assert_reports_ok([r["report"] for r in results])
    assert [r["said"] for r in results] == [[True, False, False, True]] * ws, results


# ============================================= set-up: what /dev/shm holds, and a full one


def _segments() -> set[str]:
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith("ringpg-arena-")}
    except FileNotFoundError:
        return set()


def _arena_and_segments(rank: int, ws: int, port: int, args: Any) -> dict:
    init_ringpg(rank, ws, port)
    import ringpg

    b = ringpg.backend()
    x = torch.full((100,), float(rank))
    dist.all_reduce(x)
    dist.barrier()
    left = sorted(n for n in _segments() if f"-{os.getpid()}-" in n)
    return {"arena_bytes": b.arena_bytes, "sum": x[0].item(), "left": left, "algo": b.algorithm_for("allreduce", 400)}


@pytest.mark.multiprocess
@ringpg_only
def test_no_segment_is_left_in_dev_shm_once_the_group_is_up() -> None:
    ws = 3
    res = run_scenario(_arena_and_segments, ws)
    for r, v in res.items():
        assert v["arena_bytes"] == 1 << 20 and v["algo"] == "arena_oneshot", (r, v)
        assert v["sum"] == sum(range(ws)), (r, v)
        assert v["left"] == [], (r, v)  # unlinked as soon as every rank had mapped it


def _start_with_small_dev_shm_on(rank: int, ws: int, port: int, who: int) -> None:
    """Starts the world group with arena buffers of 4 MiB, rank ``who`` with a /dev/shm of
    its own with room for the links' regions (64 KiB slots) but not for such an arena."""
    os.environ.update(
        merged_env(os.environ, {"RINGPG_TUNING": "segment_bytes=65536", "RINGPG_ARENA_BYTES": str(4 << 20)})
    )
    if rank == who:
        harness.private_dev_shm("2m")
    init_ringpg(rank, ws, port, timeout_s=20.0)


def _small_dev_shm_on(rank: int, ws: int, port: int, args: Any) -> dict:
    (who,) = args
    _start_with_small_dev_shm_on(rank, ws, port, who)
    import ringpg

    b = ringpg.backend()
    x = torch.full((1000,), float(rank + 1))
    dist.all_reduce(x)
    return {
        "arena_bytes": b.arena_bytes,
        "why": b.arena_why_not,
        "sum": x[0].item(),
        "algo": b.algorithm_for("allreduce", 4000),
    }


@pytest.mark.multiprocess
@ringpg_only
@pytest.mark.skipif(not harness.can_make_mount_namespaces(), reason="needs root and mount namespaces")
@pytest.mark.parametrize("who", [0, 1])
def test_a_dev_shm_without_room_for_the_arena_leaves_every_rank_on_its_links(who: int) -> None:
    """Rank 0 creates the arena: with too small a /dev/shm it cannot reserve it (and
    says so, naming the setting); rank 1 with a /dev/shm of its own cannot map it.
    Either way every rank runs without one, and the group works."""
    ws = 3
    res = run_scenario(_small_dev_shm_on, ws, (who,))
    for r, v in res.items():
        assert v["arena_bytes"] == 0, (r, v)
        assert v["sum"] == sum(range(1, ws + 1)), (r, v)
        assert v["algo"] not in ARENA, (r, v)
        if r == who == 0:
            assert "RINGPG_ARENA_BYTES" in v["why"] and re.search("No space|space", v["why"]), v
        elif r == who:
            assert "shm_open" in v["why"], v


def _small_dev_shm_on_one_host(rank: int, ws: int, port: int, args: Any) -> dict:
    """Two emulated hosts of three ranks (rank r on host r % 2), one rank with a /dev/shm
    of its own too small for its host's arena: the hierarchical host phases' arenas."""
    (who,) = args
    os.environ["RINGPG_HOSTID"] = f"emulated-host-{rank % 2}"
    _start_with_small_dev_shm_on(rank, ws, port, who)
    import ringpg

    b = ringpg.backend()
    x = torch.full((1 << 20,), float(rank + 1))  # 4 MiB: past the one-shot, the host phases run
    dist.all_reduce(x)
    return {
        "arena_bytes": b.arena_bytes,
        "sum": x[0].item(),
        "hosts": b.hosts,
        "algo": b.allreduce_algorithm,
    }


@pytest.mark.multiprocess
@ringpg_only
@pytest.mark.skipif(not harness.can_make_mount_namespaces(), reason="needs root and mount namespaces")
@pytest.mark.parametrize("who", [-1, 1, 4])
def test_a_host_that_cannot_make_its_arena_leaves_every_host_on_its_rings(who: int) -> None:
    """Across hosts each host maps an arena of its own, agreed by the whole group: where
    one host's cannot be made (rank 1 creates host 1's, rank 4 maps host 0's), no host
    keeps one, every rank alike, and the hierarchical allreduce runs on the host rings;
    with room everywhere (-1) every host has one."""
    ws = 6
    res = run_scenario(_small_dev_shm_on_one_host, ws, (who,))
    for r, v in res.items():
        assert v["hosts"] == 2 and v["algo"] == "hier", (r, v)
        assert (v["arena_bytes"] > 0) == (who < 0), (r, v)
        assert v["sum"] == sum(range(1, ws + 1)), (r, v)


# ============================================= failures inside a host collective


@pytest.mark.multiprocess
@ringpg_only
@pytest.mark.parametrize("op", ["broadcast", "reduce", "barrier", "all_reduce"])
def test_a_rank_dying_in_a_host_collective_fails_every_rank_fast(tmp_path: Any, op: str) -> None:
    ws = 4
    stamp = str(tmp_path / "died")
    res = run_scenario(harness.die_mid_collective, ws, (2, "exit", stamp, op), expect={0, 1, 3})
    harness.assert_survivors_raised_fast(res, stamp, op, "shm")


def _freeze_in_arena(rank: int, ws: int, port: int, args: Any) -> dict:
    (op,) = args
    init_ringpg(rank, ws, port, timeout_s=3.0)
    import ringpg

    x = torch.ones(1 << 14)
    calls = {
        "all_reduce": lambda: dist.all_reduce(x),
        "broadcast": lambda: dist.broadcast(x, src=0),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(torch.empty(x.numel() * ws), x),
        "barrier": lambda: dist.barrier(),
        "all_to_all_single": lambda: dist.all_to_all_single(torch.empty(x.numel()), x),
    }
    calls[op]()
    if rank == ws - 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    kind, msg, took = expect_error(calls[op])
    return {"type": kind, "msg": msg, "took": took, "algo": ringpg.backend().algorithm_for("allreduce", 1 << 16)}


@pytest.mark.multiprocess
@ringpg_only
@pytest.mark.parametrize("op", ["all_reduce", "broadcast", "all_gather_into_tensor", "barrier", "all_to_all_single"])
def test_a_frozen_rank_in_a_host_collective_times_out_every_rank(op: str) -> None:
    ws = 4
    res = run_scenario(_freeze_in_arena, ws, (op,), expect={0, 1, 2})
    for r, v in res.items():
        assert v["algo"] == "arena", v
        assert v["type"] in ("DistBackendError", "DistNetworkError"), (r, v)
        assert f"ringpg::{op}" in v["msg"], v["msg"]
        # The waiting ranks name the frozen one; a rank may learn of it from another's abort.
        assert (
            re.search(r"Timed out waiting for rank 3 after 3000 ms ", v["msg"])
            or "aborted" in v["msg"]
            or ("Timed out" in v["msg"])
        ), v["msg"]
        assert 2.0 < v["took"] < 3.0 + KILL_DETECT_S, (r, v)


def _mismatched_roots(rank: int, ws: int, port: int, args: Any) -> dict:
    init_ringpg(rank, ws, port, timeout_s=20.0)
    x = torch.ones(64)
    kind, msg, took = expect_error(lambda: dist.broadcast(x, src=0 if rank == 0 else 1))
    return {"type": kind, "msg": msg, "took": took}


def _mismatched_splits(rank: int, ws: int, port: int, args: Any) -> dict:
    """Rank 1 expects two rows from rank 0, which sends one."""
    init_ringpg(rank, ws, port, timeout_s=20.0)
    import ringpg

    outs = [2 if (rank, q) == (1, 0) else 1 for q in range(ws)]
    out = torch.zeros(sum(outs))
    kind, msg, took = expect_error(lambda: dist.all_to_all_single(out, torch.ones(ws), outs, [1] * ws))
    return {"type": kind, "msg": msg, "took": took, "algo": ringpg.backend().algorithm_for("all_to_all", 0)}


@pytest.mark.multiprocess
@ringpg_only
def test_ranks_that_disagree_on_all_to_all_splits_all_fail_naming_the_pair() -> None:
    """Every member reads every member's sizes in the first round, so every rank fails
    alike, at once, naming the pair, where the links could tell only the receiver."""
    res = run_scenario(_mismatched_splits, 3)
    for r, v in res.items():
        assert v["algo"] == "arena", v
        assert v["type"] == "DistBackendError", (r, v)
        assert "rank 1 expected 8 bytes from rank 0, which sent 4" in v["msg"], (r, v["msg"])
        assert "disagree on the split sizes" in v["msg"] and f"rank {r}" in v["msg"], (r, v["msg"])
        assert v["took"] < KILL_DETECT_S, v


@pytest.mark.multiprocess
@ringpg_only
def test_ranks_broadcasting_from_different_roots_get_a_clear_error() -> None:
    res = run_scenario(_mismatched_roots, 3)
    for r, v in res.items():
        assert v["type"] in ("DistBackendError", "DistNetworkError"), (r, v)
        assert "mismatch" in v["msg"] and "root" in v["msg"], v["msg"]
        assert v["took"] < KILL_DETECT_S, v


def _links_against_arena(rank: int, ws: int, port: int, args: Any) -> dict:
    init_ringpg(rank, ws, port, timeout_s=20.0)
    y = torch.ones(10)
    if ws == 2:
        # A small allreduce at two ranks keeps the links; a small broadcast takes the arena.
        call = (lambda: dist.all_reduce(y)) if rank == 0 else (lambda: dist.broadcast(y, src=0))
    else:
        # gather runs on the links at any size; allreduce in the arena from three ranks.
        outs = [torch.empty(10) for _ in range(ws)] if rank == 0 else None
        call = (lambda: dist.gather(y, outs, dst=0)) if rank == 0 else (lambda: dist.all_reduce(y))
    kind, msg, took = expect_error(call)
    return {"type": kind, "msg": msg, "took": took}


@pytest.mark.multiprocess
@ringpg_only
@pytest.mark.parametrize("ws", [2, 3])
def test_a_rank_on_the_links_and_one_in_the_arena_get_a_mismatch_not_a_timeout(ws: int) -> None:
    """Ranks calling different collectives whose algorithms differ (one on the links, one in
    the arena) never see each other's frames or stamps: each op publishes what it runs, and a
    wait that sleeps looks, so both fail with a mismatch in well under the op's timeout."""
    res = run_scenario(_links_against_arena, ws)
    for r, v in res.items():
        assert v["type"] in ("DistBackendError", "DistNetworkError"), (r, v)
        assert "mismatch" in v["msg"].lower(), (r, v["msg"])
        assert v["took"] < KILL_DETECT_S, (r, v)
