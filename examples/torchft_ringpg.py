"""A torchft training loop on ringpg that survives a killed replica, on one machine.

    pip install 'ringpg[torchft]'      # torchft==0.2.0
    python examples/torchft_ringpg.py  # 30-60 s on a busy 2-core machine

What it does: starts torchft's lighthouse (the quorum service, shipped in torchft's
compiled module) in this process, then three replica groups of one rank each, as
processes.  Each trains the same small model on its own data; every step its
gradients are averaged across the replicas by ``manager.allreduce``, which runs on a
``ringpg.torchft.ProcessGroupRingpg``.  In step 5 (or the first step after it whose
quorum holds all three), once the step's quorum has formed, replica 2 SIGKILLs
itself.  The survivors' allreduce fails at once (ringpg sees the closed
connections), torchft discards that step (``should_commit`` is False), the lighthouse
forms a new quorum without the dead replica (after 3 s of missed heartbeats), torchft
calls ``configure()`` on the ringpg group with a new store prefix and world size 2,
and training goes on.  A replacement replica 2 is started two seconds later; it joins
the next quorum, fetches the current weights from a survivor (torchft's checkpoint
transport, over HTTP) and trains with them.  At the end every replica prints its
step, the replicas it trained with, and a checksum of its weights: they agree.

Options: ``--steps N`` (default 15), ``--kill-at N`` (default 5), ``--no-restart``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import sys
import time
from datetime import timedelta
from typing import Any, Optional


def replica(
    replica_id: int,
    lighthouse: str,
    steps: int,
    kill_at: int,
    final_replicas: int,
    out: "mp.Queue",
    start: "Optional[Any]" = None,
) -> None:
    import torch
    from ringpg.torchft import ProcessGroupRingpg
    from torch import nn, optim
    from torch.distributed import TCPStore
    from torchft import Manager
    from torchft.optim import OptimizerWrapper

    torch.set_num_threads(1)
    torch.manual_seed(0)  # same initial weights everywhere (a joining replica heals anyway)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    inner = optim.SGD(model.parameters(), lr=0.05)

    # The replica group's own store (a group of one rank here); torchft's Manager
    # connects to it and hands the ringpg group prefixes of the store it gets from
    # the quorum.
    store = TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    manager = Manager(
        pg=ProcessGroupRingpg(timeout=timedelta(seconds=5)),
        min_replica_size=2,
        load_state_dict=lambda sd: (model.load_state_dict(sd["model"]), inner.load_state_dict(sd["optim"])),
        state_dict=lambda: {"model": model.state_dict(), "optim": inner.state_dict()},
        replica_id=f"replica_{replica_id}",
        store_addr="localhost",
        store_port=store.port,
        rank=0,
        world_size=1,
        lighthouse_addr=lighthouse,
        # Generous: a loaded 2-core machine (CI) can stall a step for seconds.  A dead
        # replica is still noticed at once: ringpg fails the allreduce on the closed
        # connections, whatever the timeout.
        timeout=timedelta(seconds=30),
        quorum_timeout=timedelta(seconds=120),
    )
    optimizer = OptimizerWrapper(manager, inner)
    gen = torch.Generator().manual_seed(100 + replica_id)  # each replica: its own data
    target = torch.randn(32, 1, generator=torch.Generator().manual_seed(1))
    last_n = 0
    if start is not None:
        start.wait(timeout=300)  # the first three replicas begin together, so all are in the first quorum

    # Every replica of a quorum sees the same step and participant count, so they all
    # stop at the same step: `steps` done, and (with a replacement) three replicas again.
    while manager.current_step() < steps or manager.num_participants() < final_replicas:
        x = torch.randn(64, 32, generator=gen)
        optimizer.zero_grad()  # starts the quorum (reconfiguring the ringpg group if it changed)
        loss = nn.functional.mse_loss(model(x), x @ target)
        loss.backward()
        if replica_id == 2 and kill_at >= 0 and manager.current_step() >= kill_at:
            manager.wait_quorum()
            if manager.num_participants() == 3:  # in this step's quorum with both others: their allreduce fails
                print(f"replica {replica_id}: killing myself in step {manager.current_step()}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
        for w in [manager.allreduce(p.grad) for p in model.parameters()]:  # averaged over replicas
            w.wait()
        committed = manager.should_commit()  # False after a failed allreduce: the step is redone
        if committed:
            inner.step()
        n = manager.num_participants()
        if not committed or n != last_n or manager.current_step() % 5 == 0:
            print(
                f"replica {replica_id}: step {manager.current_step():2d} loss {loss.item():8.4f} "
                f"replicas {n} {'committed' if committed else 'DISCARDED: ' + repr(manager.errored())}",
                flush=True,
            )
        last_n = n
        time.sleep(0.2)  # the rest of a real step's work

    checksum = sum(p.double().sum().item() for p in model.parameters())
    out.put((replica_id, manager.current_step(), manager.num_participants(), checksum))
    manager.shutdown(wait=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--kill-at", type=int, default=5)
    ap.add_argument("--no-restart", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("RUST_LOG", "warn")  # torchft's lighthouse and manager log every quorum at info

    from torchft.coordination import LighthouseServer

    # Quorums need two replicas; a dead replica leaves the quorum after missing
    # heartbeats for a second.
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=2, join_timeout_ms=1000, heartbeat_timeout_ms=3000)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()

    together = ctx.Barrier(3)

    def start(i: int, kill_at: int, barrier: Optional[Any] = None) -> mp.Process:
        p = ctx.Process(target=replica, args=(i, lighthouse.address(), args.steps, kill_at, expect, out, barrier))
        p.start()
        return p

    expect = 2 if args.no_restart or args.kill_at < 0 else 3  # replicas at the end
    procs = [start(i, args.kill_at, together) for i in range(3)]
    if not args.no_restart and args.kill_at >= 0:
        procs[2].join(timeout=120)
        print(f"launcher: replica 2 exited ({procs[2].exitcode}); starting a replacement in 2 s", flush=True)
        time.sleep(2)
        procs.append(start(2, kill_at=-1))
    results = sorted(out.get(timeout=180) for _ in range(expect))
    for p in procs:
        p.join(timeout=30)
    lighthouse.shutdown()
    for rid, step, n, checksum in results:
        print(f"replica {rid}: finished at step {step} with {n} replicas, weights checksum {checksum:.6f}")
    same = len({round(c, 6) for *_, c in results}) == 1
    print("all replicas agree" if same else "REPLICAS DISAGREE")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
