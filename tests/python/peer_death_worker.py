"""One rank of a two-rank torch.distributed job whose rank 1 dies after one allreduce.

Run by test_peer_death.py:  peer_death_worker.py RANK WORLD INIT_METHOD OUT_JSON HOW [N [WARM [SYNC]]]
HOW = exit (os._exit) | kill (SIGKILL); N elements per allreduce (default 1000), WARM
allreduces before rank 1 dies (default 1: with GLOO_ALGO=optireduce, more take the job past
calibration into bounded operations). SYNC = after-peer: rank 1 dies only once rank 0 has
returned from its last warm-up allreduce too (rank 0 creates the file `warm.done` next to
OUT_JSON); without it rank 1 dies as soon as its own last one returns. init_process_group has a 120 s timeout; rank 0 keeps
calling all_reduce and must raise long before it. Rank 1 writes {"died_at"} (wall clock)
just before it dies; rank 0 writes {"raised", "message", "failed_at", "bounded_ops"}.
"""

import json
import os
import signal
import sys
import time

rank, world, init_method, out_path, how = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3],
                                           sys.argv[4], sys.argv[5])
elements = int(sys.argv[6]) if len(sys.argv) > 6 else 1000
warm = int(sys.argv[7]) if len(sys.argv) > 7 else 1
after_peer = len(sys.argv) > 8 and sys.argv[8] == "after-peer"
warm_done = os.path.join(os.path.dirname(out_path), "warm.done")
import optireduce  # must precede torch

import datetime

import torch
import torch.distributed as dist


def write(obj):
    with open(out_path + ".tmp", "w") as f:
        json.dump(obj, f)
    os.rename(out_path + ".tmp", out_path)


dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=120))
for i in range(warm):
    t = torch.ones(elements)
    dist.all_reduce(t)
    if i == 0:  # exact (or, through the Hadamard transform, to rounding)
        assert torch.allclose(t, torch.full((elements,), float(world)), rtol=1e-4)
if after_peer and rank == 0:
    open(warm_done, "w").close()
if after_peer and rank == 1:
    while not os.path.exists(warm_done):
        time.sleep(0.001)
if rank == 1:
    write({"died_at": time.time()})
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(0)
for step in range(100000):
    try:
        dist.all_reduce(t)
    except RuntimeError as e:
        failed_at = time.time()
        # OptiReduce mode's bounded operations before the failure (0 on other paths).
        bounded = optireduce.stats()["optireduce"]["cumulative"]["bounded_ops"]
        write({"raised": True, "message": str(e), "failed_at": failed_at, "step": step,
               "bounded_ops": bounded})
        os._exit(0)  # the process group cannot be destroyed cleanly with a dead peer
write({"raised": False})
sys.exit(1)
