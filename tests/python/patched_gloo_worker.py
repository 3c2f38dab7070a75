"""One rank of a job on a Gloo rebuilt with patches/gloo-0001 (the hook path).

Run by test_patched_gloo.py as a separate process per rank:
    patched_gloo_worker.py RANK WORLD INIT_METHOD OUT_JSON [--load-after-torch]
LD_LIBRARY_PATH points at the patched libgloo.so.0. With --load-after-torch,
liboptireduce_torch.so ($OPTIREDUCE_TORCH_LIB) is loaded RTLD_GLOBAL *after* torch, so its
gloo::allreduce does not interpose: only the patched Gloo's dlsym hook can reach it.
Results are checked exactly; the libgloo the process mapped, the interposer's counters and
what ran go to OUT_JSON.
"""

import ctypes
import datetime
import json
import os
import sys

rank, world, init_method, out_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
import torch
import torch.distributed as dist

loaded = "--load-after-torch" in sys.argv
if loaded:
    ctypes.CDLL(os.environ["OPTIREDUCE_TORCH_LIB"], mode=ctypes.RTLD_GLOBAL)

dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=120))

ran = {"allreduce": 0, "supported": 0, "unsupported_type": 0, "unsupported_op": 0}
keep = []  # every tensor a collective saw stays alive until the process exits


def check(name, got, want):
    if not torch.equal(got, want):
        raise AssertionError(f"rank {rank}: {name}: got {got.flatten()[:4]} want "
                             f"{want.flatten()[:4]}")


for n in (1, 3, 1000, 1 << 18):
    t = torch.arange(n, dtype=torch.float32) * (rank + 1)
    keep.append(t)
    dist.all_reduce(t)
    check(f"float32 SUM n={n}", t, torch.arange(n, dtype=torch.float32) * (world * (world + 1) // 2))
    ran["allreduce"] += 1
    ran["supported"] += 1
t = torch.arange(100, dtype=torch.int64) + rank
keep.append(t)
dist.all_reduce(t, op=dist.ReduceOp.MAX)
check("int64 MAX", t, torch.arange(100, dtype=torch.int64) + world - 1)
ran["allreduce"] += 1
ran["supported"] += 1
t = torch.full((40,), float(rank + 1), dtype=torch.float16)
keep.append(t)
dist.all_reduce(t)  # 2-byte type: the hook returns 0 and stock Gloo runs it
check("float16 SUM", t, torch.full((40,), float(world * (world + 1) // 2), dtype=torch.float16))
ran["allreduce"] += 1
ran["unsupported_type"] += 1
t = torch.full((8,), 0b11 ^ (1 << rank), dtype=torch.int64)
keep.append(t)
dist.all_reduce(t, op=dist.ReduceOp.BAND)
check("int64 BAND", t, torch.zeros(8, dtype=torch.int64))
ran["allreduce"] += 1
ran["unsupported_op"] += 1
dist.barrier()

maps = open("/proc/self/maps").read().split("\n")
gloo = sorted({line.split()[-1] for line in maps if "libgloo.so" in line})
result = {"rank": rank, "ran": ran, "libgloo": gloo, "stats": None}
if loaded:
    import optireduce  # the copy loaded above

    result["stats"] = optireduce.stats()
with open(out_path, "w") as f:
    json.dump(result, f)
sys.stdout.flush()
# No destroy_process_group: the job is done and its results written; skipping the process
# group's destructor avoids a stock torch race between it and its worker threads.
os._exit(0)
