"""One rank of the time-to-accuracy run (started by tta.py; not meant to be run by hand).

    tta_worker.py RANK WORLD INIT_METHOD OUT_JSON --settings JSON

DDP training of an MLP (64 -> H -> H -> 10) on sklearn's digits. H = 1024 makes the
gradient ~4.5 MB, so with bucket_cap_mb = 2 each step allreduces a few MiB-sized buckets
(the allreduce, not the tiny compute, dominates a step, as on a large model).

Straggler: rank `straggler_rank` sleeps a delay drawn from `straggler` (a dists.py spec)
before every step's forward pass, like a slow GPU/CPU; the others meet it in the
gradient allreduce. Rank 0 prints one line per evaluation on stdout:

    EVAL <step> <epoch> <train_wall_s> <accuracy_%>

where train_wall_s is rank 0's training time since the first step, excluding evaluation.
OUT_JSON gets the final accuracy, rank 0's per-step times and optireduce.stats().
"""

import json
import os
import sys
import time

rank, world, init_method, out_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
settings = json.loads(sys.argv[sys.argv.index("--settings") + 1])
if settings["import_optireduce"]:
    import optireduce  # noqa: F401  (must precede torch: it interposes gloo::allreduce)
import datetime

import torch
import torch.distributed as dist
from sklearn.datasets import load_digits
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dists  # noqa: E402

torch.set_num_threads(1)  # 2 cores shared by 4 ranks
dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=settings["op_timeout_s"]))

digits = load_digits()
x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
y = torch.tensor(digits.target, dtype=torch.int64)
perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(1234))
test_idx, train_idx = perm[:360], perm[360:]
x_train, y_train, x_test, y_test = x[train_idx], y[train_idx], x[test_idx], y[test_idx]

torch.manual_seed(settings["seed"])
h = settings["hidden"]
model = torch.nn.Sequential(torch.nn.Linear(64, h), torch.nn.ReLU(),
                            torch.nn.Linear(h, h), torch.nn.ReLU(),
                            torch.nn.Linear(h, 10))
ddp = DDP(model, bucket_cap_mb=settings["bucket_mb"])
opt = torch.optim.SGD(ddp.parameters(), lr=settings["lr"], momentum=0.9)
loss_fn = torch.nn.CrossEntropyLoss()
straggler = dists.Sampler(settings["straggler"], seed=settings["seed"] * 1000 + rank)
is_straggler = rank == settings["straggler_rank"] % world


def accuracy():
    with torch.no_grad():
        return (model(x_test).argmax(1) == y_test).float().mean().item() * 100


batch = settings["batch"]
step = 0
train_s = 0.0
step_ms, sync_ms, delay_ms = [], [], []
evals = []
dist.barrier()
for epoch in range(settings["epochs"]):
    order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch))
    # Every rank takes the same number of samples (1437 do not split evenly): a rank with
    # one batch more would wait in that step's allreduce for peers already at the barrier.
    shard = order[rank::world][:len(x_train) // world]
    for i in range(0, len(shard) - batch + 1, batch):
        t0 = time.perf_counter()
        d = straggler.draw_ms() if is_straggler else 0.0
        if d > 0:
            time.sleep(d / 1000)
        idx = shard[i:i + batch]
        opt.zero_grad()
        loss = loss_fn(ddp(x_train[idx]), y_train[idx])
        t1 = time.perf_counter()
        loss.backward()  # DDP's bucket allreduces run here; it returns when all are done
        t2 = time.perf_counter()
        opt.step()
        if settings.get("resync_every") and step % settings["resync_every"] == 0:
            optireduce.sync_parameters(model)  # noqa: F821  (only set for optireduce)
        t3 = time.perf_counter()
        train_s += t3 - t0
        step += 1
        step_ms.append((t3 - t0) * 1000)
        sync_ms.append((t2 - t1) * 1000)
        delay_ms.append(d)
        if step % settings["eval_every"] == 0:
            acc = accuracy()
            evals.append((step, epoch, train_s, acc))
            if rank == 0:
                print("EVAL %d %d %.4f %.3f" % (step, epoch, train_s, acc), flush=True)
if step % settings["eval_every"] != 0:
    acc = accuracy()
    evals.append((step, settings["epochs"] - 1, train_s, acc))
    if rank == 0:
        print("EVAL %d %d %.4f %.3f" % (step, settings["epochs"] - 1, train_s, acc), flush=True)

result = {"rank": rank, "final_accuracy": evals[-1][3], "steps": step, "train_s": train_s,
          "evals": evals, "step_ms": step_ms, "sync_ms": sync_ms, "delay_ms": delay_ms}
if settings["import_optireduce"]:
    result["stats"] = optireduce.stats()  # noqa: F821  (imported above, before torch)
    result["config"] = optireduce.config()  # noqa: F821
dist.barrier()
dist.destroy_process_group()
with open(out_path, "w") as f:
    json.dump(result, f)
