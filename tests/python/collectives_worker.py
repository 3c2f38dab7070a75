"""One rank of a torch.distributed job that exercises Gloo collectives.

Run by test_collectives.py as a separate process per rank:
    collectives_worker.py RANK WORLD INIT_METHOD OUT_JSON [--import-optireduce]
GLOO_ALGO / GLOO_DEVICE_TRANSPORT / LD_PRELOAD come from the environment. Every result is
checked exactly here (values are small integers, so float sums are exact in any order);
the first mismatch raises. Writes the interposer counters and what it ran to OUT_JSON.
"""

import json
import sys

rank, world, init_method, out_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
if "--import-optireduce" in sys.argv:
    import optireduce  # noqa: F401  (must precede torch)
import datetime

import torch
import torch.distributed as dist
import keep_tensors  # noqa: E402  (this folder: tests/python)
keep_tensors.install()

dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=120))

ran = {"allreduce": 0, "allreduce_supported": 0, "allreduce_unsupported_op": 0,
       "allreduce_unsupported_type": 0}


def values(r, n, dtype, op):
    # Small integers: every float sum/product/max is exact, whatever the order.
    idx = torch.arange(n, dtype=torch.int64)
    if op == dist.ReduceOp.PRODUCT:
        v = ((idx + r) % 3) - 1  # -1, 0, 1: products stay tiny
        v[(idx % 5) == 0] = 2 if r == 0 else 1
    else:
        v = ((idx * 7 + r * 13) % 101) - 50
    return v.to(dtype)


def expected(n, dtype, op):
    parts = [values(r, n, dtype, op).to(torch.float64) for r in range(world)]
    acc = parts[0].clone()
    for p in parts[1:]:
        if op == dist.ReduceOp.SUM:
            acc += p
        elif op == dist.ReduceOp.PRODUCT:
            acc *= p
        elif op == dist.ReduceOp.MAX:
            acc = torch.maximum(acc, p)
        elif op == dist.ReduceOp.MIN:
            acc = torch.minimum(acc, p)
    return acc.to(dtype)


import os

# GLOO_ALGO=optireduce applies the randomized Hadamard transform to float sums whose TAR
# shards are under 2^17 elements, every tensor here (unless OPTIREDUCE_HADAMARD=0): their
# results are then correct to rounding, not bit-exact.
HADAMARD_SUMS = (os.environ.get("GLOO_ALGO", "").lower() == "optireduce"
                 and os.environ.get("OPTIREDUCE_HADAMARD", "1") not in ("0", "off", "false"))
OP_NAMES = {dist.ReduceOp.SUM: "SUM", dist.ReduceOp.MAX: "MAX", dist.ReduceOp.MIN: "MIN",
            dist.ReduceOp.PRODUCT: "PRODUCT"}


def check(name, got, want, rounding=False):
    if rounding and got.is_floating_point():
        # Values are up to ~50 * world; the transform's rounding is a few ulps of that.
        tol = (1e-4 if got.dtype == torch.float32 else 1e-10) * world
        if torch.allclose(got, want, rtol=0, atol=tol):
            return
    if not torch.equal(got, want):
        bad = (got != want).nonzero()
        i = bad[0].item() if bad.numel() else -1
        raise AssertionError(f"rank {rank}: {name}: {bad.numel()} elements differ, first at "
                             f"{i}: got {got.flatten()[i].item()} want {want.flatten()[i].item()}")


# Sizes: fewer elements than ranks, odd, and a 1M-element tensor (several MB: many
# datagrams, and several TAR segments when the segment is small).
# --small (4-rank jobs on 2 cores): the big tensor has 64K elements.
BIG = (1 << 16) if "--small" in sys.argv else (1 << 20)
sizes = [1, 3, 1000, BIG]
for dtype in (torch.float32, torch.float64, torch.int64):
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN):
        for n in sizes:
            if n == BIG and (dtype != torch.float32 or op != dist.ReduceOp.SUM):
                continue
            t = values(rank, n, dtype, op)
            dist.all_reduce(t, op=op)
            check(f"all_reduce {dtype} {OP_NAMES[op]} n={n}", t, expected(n, dtype, op),
                  rounding=HADAMARD_SUMS and op == dist.ReduceOp.SUM)
            ran["allreduce"] += 1
            ran["allreduce_supported"] += 1

# One size again and again, as DDP's buckets every step: with GLOO_ALGO=optireduce the first
# ones calibrate the bound (reliable TAR) and the rest run bounded (OptiReduce mode; the test
# checks that some did). No loss is injected, so the results are exact to rounding.
# A rank later than the start grace (the host deschedules it) is left out of a bounded
# operation: every rank then holds the same flagged result without its share, carried into
# the next operation on the buffer. Such results are not this call's exact sum, by design;
# the worker counts the calls it checked exactly.
from flagged_ops import flagged  # noqa: E402  (this folder: tests/python)


REPEAT = 24
ran["repeated_exact"] = 0
for i in range(REPEAT):
    t = values(rank + i, 4096, torch.float32, dist.ReduceOp.SUM)
    before = flagged()
    dist.all_reduce(t)
    want = sum(values(r + i, 4096, torch.float32, dist.ReduceOp.SUM).to(torch.float64)
               for r in range(world)).to(torch.float32)
    if flagged() == before:
        check(f"repeated all_reduce #{i}", t, want, rounding=HADAMARD_SUMS)
        ran["repeated_exact"] += 1
    ran["allreduce"] += 1
    ran["allreduce_supported"] += 1
ran["repeated"] = REPEAT

# Several all_reduces in flight at once (DDP's buckets): distinct tags, async.
tensors = [values(rank, 5000 + 17 * i, torch.float32, dist.ReduceOp.SUM) for i in range(6)]
before = flagged()
works = [dist.all_reduce(t, async_op=True) for t in tensors]
for w in works:
    w.wait()
async_exact = flagged() == before  # these sizes are calibrating: reliable, exact
for i, t in enumerate(tensors):
    if async_exact:
        check(f"async all_reduce #{i}", t,
              expected(5000 + 17 * i, torch.float32, dist.ReduceOp.SUM), rounding=HADAMARD_SUMS)
    ran["allreduce"] += 1
    ran["allreduce_supported"] += 1

# Coalesced (one gloo::allreduce over a flattened tensor list).
pieces = [values(rank, 10 + i, torch.float64, dist.ReduceOp.SUM) for i in range(3)]
dist.all_reduce_coalesced(pieces)
for i, p in enumerate(pieces):
    check(f"coalesced #{i}", p, expected(10 + i, torch.float64, dist.ReduceOp.SUM),
          rounding=HADAMARD_SUMS)
ran["allreduce"] += 1
ran["allreduce_supported"] += 1

# Ops and types TAR does not take: forwarded to stock Gloo, still correct.
t = torch.full((33,), 0b1111 ^ (1 << rank), dtype=torch.int64)
dist.all_reduce(t, op=dist.ReduceOp.BAND)
want = 0b1111
for r in range(world):
    want &= 0b1111 ^ (1 << r)
check("all_reduce BAND", t, torch.full((33,), want, dtype=torch.int64))
ran["allreduce"] += 1
ran["allreduce_unsupported_op"] += 1
t = torch.full((40,), float(rank + 1), dtype=torch.float16)
dist.all_reduce(t)
check("all_reduce float16", t, torch.full((40,), float(world * (world + 1) // 2),
                                          dtype=torch.float16))
ran["allreduce"] += 1
ran["allreduce_unsupported_type"] += 1

# Other collectives over the same device.
t = torch.arange(100, dtype=torch.float32) * (rank + 1)
dist.broadcast(t, src=world - 1)
check("broadcast", t, torch.arange(100, dtype=torch.float32) * world)
dist.barrier()
outs = [torch.zeros(50, dtype=torch.int64) for _ in range(world)]
dist.all_gather(outs, torch.full((50,), rank, dtype=torch.int64))
for r in range(world):
    check(f"all_gather[{r}]", outs[r], torch.full((50,), r, dtype=torch.int64))
if rank % 2 == 0 and rank + 1 < world:
    dist.send(torch.arange(BIG, dtype=torch.float32) + rank, dst=rank + 1)
elif rank % 2 == 1:
    t = torch.zeros(BIG, dtype=torch.float32)
    dist.recv(t, src=rank - 1)
    check("recv", t, torch.arange(BIG, dtype=torch.float32) + rank - 1)
dist.barrier()

result = {"rank": rank, "ran": ran}
ran["sync_parameters"] = 0
try:
    import optireduce

    result["stats"] = optireduce.stats()
    # sync_parameters: every rank ends with rank world-1's parameters and buffers, each dtype.
    m = torch.nn.Linear(5, 3)
    with torch.no_grad():
        m.weight.fill_(rank + 1.0)
        m.bias.fill_(-float(rank))
    m.register_parameter("half_steps", torch.nn.Parameter(torch.full((4,), rank * 0.5,
                                                                     dtype=torch.float64)))
    m.register_buffer("steps", torch.full((2,), rank, dtype=torch.int64))
    optireduce.sync_parameters(m, src=world - 1)
    check("sync_parameters weight", m.weight.detach(), torch.full((3, 5), float(world)))
    check("sync_parameters bias", m.bias.detach(), torch.full((3,), -float(world - 1)))
    check("sync_parameters float64", m.half_steps.detach(),
          torch.full((4,), (world - 1) * 0.5, dtype=torch.float64))
    check("sync_parameters buffer", m.steps, torch.full((2,), world - 1, dtype=torch.int64))
    ran["sync_parameters"] = 1
except ImportError as e:  # running without optireduce (stock baseline)
    result["stats"] = None
    result["import_error"] = str(e)
dist.destroy_process_group()
with open(out_path, "w") as f:
    json.dump(result, f)
