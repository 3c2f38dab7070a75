"""One rank of a job that allreduces a list of tensors in one call (or, with --mismatch,
one tensor of a different size on each rank).

Run by test_tensor_lists.py as a separate process per rank:
    tensor_list_worker.py RANK WORLD INIT_METHOD OUT_JSON [--mismatch]
GLOO_ALGO / GLOO_DEVICE_TRANSPORT / LD_PRELOAD come from the environment.

`dist.all_reduce_multigpu([t1, t2])` on CPU tensors: ProcessGroupGloo passes both tensors
as outputs (no inputs) of one gloo::allreduce, which sums every tensor of every rank into
all of them (stock Gloo: each element of both tensors is the sum over ranks of t1 + t2).
Repeated past OptiReduce mode's calibration (20 operations of a size), so bounded
operations run too. The first wrong element raises; OUT_JSON gets what ran.
"""

import datetime
import json
import os
import sys
import warnings

rank, world, init_method, out_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
import optireduce  # noqa: F401  (must precede torch)
import torch
import torch.distributed as dist

import keep_tensors  # noqa: E402  (this folder: tests/python)
keep_tensors.install()

dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=120))
warnings.simplefilter("ignore")  # all_reduce_multigpu's deprecation warning, every call

# OptiReduce mode transforms float sums of this size (Hadamard): correct to rounding, not
# bit-exact.
ROUNDING = os.environ.get("GLOO_ALGO", "").lower() == "optireduce"
N = 4096


def check(name, got, want):
    tol = 1e-4 * float(want.abs().max()) if ROUNDING else 0.0
    if torch.allclose(got, want, rtol=0, atol=tol):
        return
    bad = ((got - want).abs() > tol).nonzero()
    i = bad[0].item()
    raise AssertionError(f"rank {rank}: {name}: {bad.numel()} elements differ, first at {i}: "
                         f"got {got[i].item()} want {want[i].item()}")


def mismatch():
    """OptiReduce mode, both sizes calibrated on both ranks (20 operations each), then rank 0
    allreduces 65536 floats and rank 1 32768: each must raise naming both sizes in bytes
    and leave NaN in its tensor; the next operation of equal sizes must be exact."""
    sizes = {0: 65536, 1: 32768}
    for n in sorted(set(sizes.values())):
        for _ in range(20):
            t = torch.ones(n)
            dist.all_reduce(t)
            check(f"calibration of {n}", t, torch.full((n,), float(world)))
    mine = sizes[rank]
    t = torch.full((mine,), float(rank + 1))
    error = ""
    try:
        dist.all_reduce(t)
    except RuntimeError as e:
        error = str(e)
    nan = bool(torch.isnan(t).all())
    after = torch.full((65536,), float(rank + 1))
    dist.all_reduce(after)
    check("the operation after the mismatch", after,
          torch.full((65536,), float(sum(r + 1 for r in range(world)))))
    return {"error": error, "nan": nan, "mine": mine * 4, "other": sizes[1 - rank] * 4,
            "stats": optireduce.stats()}


if "--mismatch" in sys.argv:
    result = mismatch()
    with open(out_path, "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()
    sys.exit(0)

from flagged_ops import flagged  # noqa: E402  (this folder: tests/python)


def all_reduce_list(tensors):
    """Allreduce a list of tensors in one call; True when its result must be the exact sum.

    torch 1.x has dist.all_reduce_multigpu; torch 2.x removed it, and the process group's
    own allreduce takes the same list and reaches gloo::allreduce with the same outputs.
    """
    before = flagged()
    if hasattr(dist, "all_reduce_multigpu"):
        dist.all_reduce_multigpu(tensors)
    else:
        keep_tensors.keep(tensors)
        dist.distributed_c10d._get_default_group().allreduce(tensors).wait()
    return flagged() == before


ops = exact_checked = 0
for step in range(24):
    idx = torch.arange(N, dtype=torch.float32)
    t1 = (rank + 1) + (idx % 7) + step
    t2 = 10 * (rank + 1) + (idx % 5)
    want = sum(((r + 1) + (idx % 7) + step) + (10 * (r + 1) + (idx % 5)) for r in range(world))
    if all_reduce_list([t1, t2]):
        check(f"step {step} tensor 0", t1, want)
        check(f"step {step} tensor 1", t2, want)
        exact_checked += 1
    # Three tensors, one of them 0: every one still receives the whole sum.
    t3 = [torch.full((N,), float(rank + 1)), torch.zeros(N), torch.full((N,), 100.0)]
    if all_reduce_list(t3):
        total = float(sum(r + 1 + 100 for r in range(world)))
        for k, t in enumerate(t3):
            check(f"step {step} list of 3, tensor {k}", t, torch.full((N,), total))
        exact_checked += 1
    ops += 2

result = {"ops": ops, "exact_checked": exact_checked, "stats": optireduce.stats()}
with open(out_path, "w") as f:
    json.dump(result, f)
dist.destroy_process_group()
