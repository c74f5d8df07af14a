"""Tensor-parallel decode: the per-op cost of a small allreduce, as an inference loop pays it.

Each of N ranks on this host runs a decode loop emulating a tensor-parallel model: one
token is ``--layers`` layers, and every layer is one local op and one allreduce (SUM) of
the ``[batch, hidden]`` activations. The local op stands in for the layer's sharded
matmul and is kept tiny on purpose, one elementwise multiply by a per-rank scale vector
(its cost is measured and printed), so that a token's time is almost all collective::

    python -m benchmarks.decode                           # 2 ranks, bf16, 4096 x 32 layers, 64 tokens
    python -m benchmarks.decode --quick --check           # seconds: 8 tokens of 4 layers, results checked
    python -m benchmarks.decode --modes eager --dtype float32 --world-size 4

Two modes: ``eager`` calls ``dist.all_reduce`` in place; ``compiled`` runs the token under
``torch.compile`` with functional collectives (``_functional_collectives.all_reduce``),
compiled once per backend and warmed up (``--compile-backend``: inductor, or aot_eager;
where inductor fails every rank retries with aot_eager, and where that fails too the
mode is left out with a note). A third, ``functional`` (not run by default), calls the
functional collectives without compiling: what compiling adds, and what they cost apart.
Backends (default ringpg and gloo) run in the same processes and take turns token by
token, the order flipping every token; each token follows a barrier of its own backend
and is timed from the last rank's start to the last rank's end (``timing.op_times_ns``).
Reported per mode and backend: microseconds per allreduce (a token's time / layers, the
local op included) and per token, median and p10/p90 over the tokens, and gloo's median
/ ringpg's (> 1: ringpg faster).

Exact by construction: rank r's scale is s_r (rank 0: 1 - sum of the others, the others
+2 and -2 in turn, so they sum to 1) and a token's input holds small integers, so every
layer's allreduce gives back its input exactly, in bf16 too; ``--check`` compares each
token's output with its input on every rank, for every backend and mode, and exits 1 on
any wrong element.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from benchmarks.backends import backend_status, new_group_of, one_line
from benchmarks.data import count_diff
from benchmarks.timing import op_times_ns, ranks_share_clock
from devkit.launch import add_start_argument, run_ranks
from devkit.machine import default_threads, machine_facts

MODES = ("eager", "functional", "compiled")
COMPILE_BACKENDS = ("inductor", "aot_eager")
Step = Callable[[torch.Tensor], torch.Tensor]


def rank_scale(rank: int, ws: int) -> float:
    """Rank ``rank``'s layer scale: the others +2, -2, +2, ..., rank 0 what makes the sum 1."""
    if rank > 0:
        return 2.0 if rank % 2 == 1 else -2.0
    return 1.0 - sum(rank_scale(r, ws) for r in range(1, ws))


def token_input(t: int, batch: int, hidden: int, ws: int, dtype: torch.dtype) -> torch.Tensor:
    """Token ``t``'s activations: integers small enough that every partial sum of the
    allreduce (at most ``amp * (ws + 3)``) is exact in bf16's 8-bit significand."""
    amp = max(1, min(7, 255 // (ws + 3)))
    i = torch.arange(batch * hidden, dtype=torch.int64).reshape(batch, hidden)
    return ((i * 7 + t * 3) % (2 * amp + 1) - amp).to(dtype)


def make_step(group: Any, layers: int, scale: torch.Tensor, functional: bool) -> Step:
    """One token: ``layers`` times a local multiply, then an allreduce (SUM) over ``group``."""
    if functional:
        from torch.distributed._functional_collectives import all_reduce as fc_all_reduce
        from torch.distributed._functional_collectives import wait_tensor

        def step_fc(h: torch.Tensor) -> torch.Tensor:
            for _ in range(layers):
                h = fc_all_reduce(h * scale, "sum", group)
            return wait_tensor(h)  # uncompiled, the last one's wait belongs in the token too

        return step_fc

    def step_eager(h: torch.Tensor) -> torch.Tensor:
        for _ in range(layers):
            h = h * scale
            dist.all_reduce(h, group=group)
        return h

    return step_eager


def _compiled_steps(
    groups: Dict[str, Any], layers: int, scale: torch.Tensor, x: torch.Tensor, want: str
) -> Tuple[Dict[str, Step], str, str]:
    """Every backend's token under torch.compile, compiled and run once (a warm-up), the
    compiler that made them (``inductor``, ``aot_eager``, or ``unavailable`` with no steps)
    and a note: what failed, and what the compiler made. Collective: every rank tries the same backends in the same order
    and they agree after each try (a rank whose compile fails runs that call eagerly, with
    the same collectives, so no rank waits on another)."""
    import torch._dynamo
    from torch._dynamo.backends.registry import lookup_backend

    torch._dynamo.config.suppress_errors = True  # a failed compile runs the frame eagerly
    try:
        import torch._inductor.config as inductor_config

        inductor_config.compile_threads = 1  # no pool of compile workers on a small machine
    except ImportError:
        pass
    notes: List[str] = []
    for name in COMPILE_BACKENDS[COMPILE_BACKENDS.index(want) :]:
        graphs: List[int] = []  # all_reduce nodes of each graph compiled

        def counting(gm: Any, example_inputs: Any, inner: str = name, seen: List[int] = graphs) -> Any:
            compiled = lookup_backend(inner)(gm, example_inputs)
            seen.append(sum("all_reduce" in str(n.target) for n in gm.graph.nodes))
            return compiled

        torch._dynamo.reset()
        steps: Dict[str, Step] = {}
        t0 = time.perf_counter()
        error = ""
        for label, g in groups.items():
            before = len(graphs)
            try:
                steps[label] = torch.compile(make_step(g, layers, scale, functional=True), backend=counting)
                steps[label](x)
            except Exception as e:  # noqa: BLE001 - reported, the next backend is tried
                error = one_line(e, 200)
            if len(graphs) == before and not error:
                error = f"{name} did not compile the token for {label}; its error is on stderr"
        took = time.perf_counter() - t0
        ok = torch.tensor([0 if error else 1], dtype=torch.int32)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        if int(ok.item()):
            notes.append(f"{name}: {len(graphs)} graph(s), all_reduce nodes {graphs}, compiled in {took:.1f} s")
            return steps, name, "; ".join(notes)
        notes.append(f"{name} failed ({error or 'on another rank'})")
    torch._dynamo.reset()
    return {}, "unavailable", "; ".join(notes)


def _rank(rank: int, ws: int, port: int, args: argparse.Namespace, q: Any) -> None:
    torch.set_num_threads(default_threads(ws))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ws)
    import ringpg  # noqa: F401 - registers the backend in a spawned rank

    groups = {b: new_group_of(b, timedelta(seconds=args.op_timeout)) for b in args.backends}
    shared_clock = ranks_share_clock(dist.group.WORLD)
    dtype = getattr(torch, args.dtype)
    scale = torch.full((args.hidden,), rank_scale(rank, ws), dtype=dtype)
    xs = [token_input(t, args.batch, args.hidden, ws, dtype) for t in range(args.warmup + args.tokens)]
    res: Dict[str, Any] = {"rank": rank, "times": {}, "wrong": {}, "notes": {}, "compiler": "unavailable"}

    pc = time.perf_counter_ns
    local = []
    for _ in range(200):
        t0 = pc()
        xs[0] * scale
        local.append(pc() - t0)
    res["local_op_us"] = statistics.median(local) / 1000

    for mode in args.modes:
        if mode != "compiled":
            steps = {b: make_step(g, args.layers, scale, functional=mode == "functional") for b, g in groups.items()}
        else:
            steps, res["compiler"], res["notes"][mode] = _compiled_steps(
                groups, args.layers, scale, xs[0], args.compile_backend
            )
            if not steps:
                continue
        spans: Dict[str, List[Tuple[int, int, int]]] = {b: [] for b in steps}
        wrong = {b: 0 for b in steps}
        for t, x in enumerate(xs):
            for b in list(steps) if t % 2 == 0 else list(steps)[::-1]:
                dist.barrier(group=groups[b])
                t0 = pc()
                out = steps[b](x)
                t1 = pc()
                if t >= args.warmup:
                    spans[b].append((t0, t1, t1 - t0))
                if args.check:
                    wrong[b] += count_diff(out, x)
        for b in steps:
            every = torch.tensor(spans[b], dtype=torch.int64)
            dist.all_reduce(every, op=dist.ReduceOp.MAX)
            res["times"][(mode, b)] = (op_times_ns(every, 1, shared_clock) / 1000).tolist()
            n = torch.tensor([wrong[b]], dtype=torch.int64)
            dist.all_reduce(n)
            res["wrong"][(mode, b)] = int(n.item())
    dist.barrier()
    dist.destroy_process_group()
    q.put(res)


def spread(values: Sequence[float]) -> Tuple[float, float, float]:
    """(p10, median, p90) of ``values``."""
    if len(values) < 2:
        v = values[0] if values else float("nan")
        return v, v, v
    deciles = statistics.quantiles(values, n=10, method="inclusive")
    return deciles[0], statistics.median(values), deciles[-1]


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world-size", type=int, default=2, help="ranks on this host (N)")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    ap.add_argument("--layers", type=int, default=None, help="allreduces per token (default 32, --quick 4)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument(
        "--tokens", type=int, default=None, help="timed tokens per backend and mode (default 64, --quick 8)"
    )
    ap.add_argument("--warmup", type=int, default=None, help="untimed tokens first (default 4, --quick 2)")
    ap.add_argument("--backends", default="ringpg,gloo", help="comma list, as the bench's --backends")
    ap.add_argument("--modes", default="eager,compiled", help="comma list of: " + ", ".join(MODES))
    ap.add_argument("--compile-backend", choices=COMPILE_BACKENDS, default="inductor")
    ap.add_argument("--quick", action="store_true", help="tiny: 8 tokens of 4 layers (seconds, plus compiling)")
    ap.add_argument("--check", action="store_true", help="check every token's result exactly; exit 1 if wrong")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds for the whole run")
    ap.add_argument("--op-timeout", type=float, default=120.0, help="process groups' timeout, seconds")
    add_start_argument(ap)
    args = ap.parse_args(argv)
    args.layers = args.layers or (4 if args.quick else 32)
    args.tokens = args.tokens or (8 if args.quick else 64)
    args.warmup = args.warmup if args.warmup is not None else (2 if args.quick else 4)
    args.backends = args.backends.split(",")
    args.modes = args.modes.split(",")
    bad = [m for m in args.modes if m not in MODES]
    if bad:
        ap.error(f"unknown mode(s) {bad}; choose from {', '.join(MODES)}")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    for b in args.backends:
        ok, desc = backend_status(b, "cpu")
        if not ok:
            print(f"# backend {b} is not usable: {desc}", file=sys.stderr)
            return 2
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    print(f"# decode: running {args.world_size} ranks ...", file=sys.stderr, flush=True)
    results = run_ranks(_rank, args.world_size, (args,), args.timeout, args.start)
    r0 = next(r for r in results if r["rank"] == 0)
    facts = machine_facts({}, "cpu")
    ran = {m for m, _ in r0["times"]}
    modes = [f"{m}({r0['compiler']})" if m == "compiled" else m for m in args.modes]
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    print(
        f"# decode {datetime.datetime.now().astimezone().isoformat(timespec='seconds')} cpu={facts['cpu']!r} "
        f"nproc={facts['nproc'].split()[0]} torch={torch.__version__} N={args.world_size} dtype={args.dtype} "
        f"hidden={args.hidden} layers={args.layers} batch={args.batch} tokens={args.tokens} "
        f"modes={','.join(modes)} load={load}"
    )
    print(
        f"# local op per layer (h * scale, [{args.batch}, {args.hidden}] {args.dtype}): {r0['local_op_us']:.2f} us; "
        "times: last rank's start to last rank's end, each token after its backend's barrier"
    )
    for m, note in r0["notes"].items():
        print(f"# {m}: torch.compile {note}" if m in ran else f"# {m}: SKIPPED, torch.compile unusable here: {note}")
    print(
        f"{'mode':<10} {'backend':<10} {'us/allreduce p10':>16} {'median':>9} {'p90':>9}"
        f" {'us/token p10':>13} {'median':>9} {'p90':>9}" + (f" {'#wrong':>7}" if args.check else "")
    )
    failed = False
    for m in args.modes:
        rows = {b: r0["times"][(m, b)] for b in args.backends if (m, b) in r0["times"]}
        for b, times in rows.items():
            tok = spread(times)
            ar = tuple(v / args.layers for v in tok)
            wrong = r0["wrong"][(m, b)]
            failed |= wrong > 0
            print(
                f"{m:<10} {b:<10} {ar[0]:16.1f} {ar[1]:9.1f} {ar[2]:9.1f} {tok[0]:13.1f} {tok[1]:9.1f} {tok[2]:9.1f}"
                + (f" {wrong:7d}" if args.check else "")
            )
        if "ringpg" in rows and "gloo" in rows:
            ratio = statistics.median(rows["gloo"]) / statistics.median(rows["ringpg"])
            print(f"{m:<10} {'gloo/ringpg':<10} {ratio:16.2f}x (median; > 1: ringpg faster)")
    if args.check:
        print("# check: " + ("FAILED, wrong elements above" if failed else "every token exact on every rank"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
