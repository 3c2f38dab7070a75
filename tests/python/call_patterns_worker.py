"""One rank of a job that makes the calls newer torch makes differently (test_call_patterns.py).

    call_patterns_worker.py RANK WORLD INIT_METHOD OUT_JSON
Rendezvous is torchrun's: init_process_group("gloo") with no init_method, rank or world
size; RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT come from the environment (env://,
whose TCPStore server is libuv-based on torch >= 2.4). `import optireduce` comes first.
Writes what each call did (values checked here, or the error it raised and how long it
took) and the interposer's counters to OUT_JSON.
"""

import json
import os
import sys
import time

import optireduce  # noqa: F401  (first import)
import datetime

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllreduceOptions

rank, world, out_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[4]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
assert dist.get_rank() == rank and dist.get_world_size() == world
seen = {"torch": torch.__version__}
keep = []  # every tensor a collective saw stays alive until the process exits


def outcome(fn):
    t0 = time.monotonic()
    try:
        value = fn()
        return {"ok": value, "seconds": time.monotonic() - t0}
    except Exception as e:  # noqa: BLE001  (the outcome is compared with stock Gloo's)
        return {"raised": type(e).__name__, "message": str(e)[:300],
                "seconds": time.monotonic() - t0}


def all_reduce(values, dtype, op=dist.ReduceOp.SUM):
    t = torch.tensor(values, dtype=dtype)
    keep.append(t)
    dist.all_reduce(t, op=op, async_op=True).wait()
    return t.to(torch.float64).tolist()


# Exact in every listed dtype: small integers, halves and quarters.
mine = [float(rank + 1), 0.5 * rank, -2.0, 0.25 * (rank + 1)] * 25
seen["sum_float32"] = outcome(lambda: all_reduce(mine, torch.float32))
seen["sum_float16"] = outcome(lambda: all_reduce(mine, torch.float16))
seen["sum_bfloat16"] = outcome(lambda: all_reduce(mine, torch.bfloat16))
seen["max_float16"] = outcome(lambda: all_reduce(mine, torch.float16, dist.ReduceOp.MAX))
# The ranks meet here with a one-element allreduce, not dist.barrier(): torch 1.13's Gloo
# barrier first waits for the group's work still listed as in progress, and a call above
# that raised (bfloat16 is not a torch 1.13 Gloo type) can still be listed a moment after
# its wait() returned — the barrier then raises that error again on one rank only.
keep.append(torch.zeros(1))
dist.all_reduce(keep[-1])
# AVG: torch 1.13's Gloo refuses it (its error surfaces at the group's next call, which a
# group of its own keeps away from the rest); newer torch may run it as SUM then a division.
avg_group = dist.new_group()


def avg(values, dtype):
    t = torch.tensor(values, dtype=dtype)
    keep.append(t)
    dist.all_reduce(t, op=dist.ReduceOp.AVG, group=avg_group)
    dist.barrier(group=avg_group)
    return t.to(torch.float64).tolist()


seen["avg_float32"] = outcome(lambda: avg(mine, torch.float32))


# A per-operation timeout (AllreduceOptions.timeout) shorter than the group's, on an
# allreduce rank 0 never joins: it must raise, after about the operation's timeout on a
# torch that passes it to Gloo (the group's 30 s otherwise, which the test allows).
def lone_allreduce():
    t = torch.ones(1000)
    keep.append(t)
    opts = AllreduceOptions()
    opts.timeout = datetime.timedelta(seconds=3)
    dist.distributed_c10d._get_default_group().allreduce([t], opts).wait()
    return t.tolist()[:1]


store = dist.distributed_c10d._get_default_store()
if rank != 0:
    seen["op_timeout"] = outcome(lone_allreduce)
    store.set(f"op_timeout_done_{rank}", "1")
else:
    # Rank 0 serves the store: it stays (its device up) until the others have seen their
    # error.
    seen["op_timeout"] = {"skipped": "this rank does not join"}
    store.wait([f"op_timeout_done_{r}" for r in range(1, world)],
               datetime.timedelta(seconds=120))

result = {"rank": rank, "seen": seen, "stats": optireduce.stats()}
with open(out_path, "w") as f:
    json.dump(result, f)
sys.stdout.flush()
# The context saw a timed-out operation: leave without tearing the group down.
os._exit(0)
