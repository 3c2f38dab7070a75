"""One rank using optireduce.RedisStore for torch.distributed rendezvous.

    redis_store_worker.py RANK WORLD UNUSED_INIT OUT_JSON
Needs OPTIREDUCE_REDIS_URL and TEST_JOB_ID in the environment.
"""

import datetime
import json
import os
import sys

rank, world, out_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[4]
import optireduce  # noqa: E402  (before torch)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import keep_tensors  # noqa: E402  (this folder: tests/python)
keep_tensors.install()

store = optireduce.RedisStore(job_id=os.environ["TEST_JOB_ID"], world_size=world,
                              timeout=datetime.timedelta(seconds=60))
dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=60))
t = torch.full((1000,), float(rank + 1))
dist.all_reduce(t)
assert torch.equal(t, torch.full((1000,), float(world * (world + 1) // 2))), t[:4]

# The store itself, used by both ranks at once (torch semantics).
store.set(f"from/{rank}", f"hello {rank}")
store.wait([f"from/{r}" for r in range(world)])
seen = [store.get(f"from/{r}").decode() for r in range(world)]
counter = store.add("counter", rank + 1)
dist.barrier()
total = store.add("counter", 0)
stats = optireduce.stats()
dist.destroy_process_group()
store.close()
with open(out_path, "w") as f:
    json.dump({"seen": seen, "counter": counter, "total": total, "stats": stats}, f)
