"""One rank of the time-to-accuracy run (started by tta.py; not meant to be run by hand).

    tta_worker.py RANK WORLD INIT_METHOD OUT_JSON --settings JSON

DDP training of settings["workload"]: `digits` (digits.py: an MLP on sklearn's digits,
metric test accuracy %) or `charlm` (charlm.py: a character-level transformer language
model on Python's standard-library sources, metric validation loss in nats).

Straggler: rank `straggler_rank` sleeps a delay drawn from `straggler` (a dists.py spec)
before every step's forward pass, like a slow GPU/CPU; the others meet it in the
gradient allreduce. Every `eval_every` steps rank 0 evaluates its replica while the others
wait in a barrier (so no rank enters the next allreduce late because of an evaluation);
after the last step every rank evaluates its own. Rank 0 prints

    EVAL <step> <epoch> <train_wall_s> <metric>

where train_wall_s is rank 0's training time since the first step, excluding evaluation
and the replica check. OUT_JSON gets every rank's final metric, rank 0's per-step times and
optireduce.stats(); OUT_JSON.params gets the rank's final parameters (float64, raw, in
model.parameters() order), which tta.py compares across ranks.

check_replicas: after every optimizer step each rank hashes its parameters' bytes
(BLAKE2b, 8 bytes) and the ranks all_gather the hashes (Gloo's allgather: only allreduce
is interposed, so this never runs through OptiReduce mode); a step where the hashes
differ counts in mismatched_steps.
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
import hashlib

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dists  # noqa: E402

torch.set_num_threads(1)  # 2 cores shared by 4 ranks
dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=settings["op_timeout_s"]))

if settings["workload"] == "charlm":
    import charlm as workload_module  # noqa: E402
else:
    import digits as workload_module  # noqa: E402
work = workload_module.Workload(settings, rank, world)
torch.manual_seed(settings["seed"])
model = work.model(settings)
ddp = DDP(model, bucket_cap_mb=settings["bucket_mb"])
opt = work.optimizer(ddp.parameters(), settings)
straggler = dists.Sampler(settings["straggler"], seed=settings["seed"] * 1000 + rank)
is_straggler = rank == settings["straggler_rank"] % world


def param_hash():
    h = hashlib.blake2b(digest_size=8)
    for p in model.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return int.from_bytes(h.digest(), "little", signed=True)


def replicas_agree():
    mine = torch.tensor([param_hash()], dtype=torch.int64)
    every = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    return all(int(t.item()) == int(mine.item()) for t in every)


def evaluate(step, epoch, every_rank):
    if rank == 0 or every_rank:
        value, se = work.evaluate(model)
        evals.append((step, epoch, train_s, value, se))
    if rank == 0:
        print("EVAL %d %d %.4f %.5f" % (step, epoch, train_s, value), flush=True)
    dist.barrier()


step = 0
epoch = 0
train_s = 0.0
step_ms, sync_ms, delay_ms = [], [], []
evals = []
checked = mismatched = 0
first_mismatch = None
dist.barrier()
for epoch, x, y in work.batches():
    t0 = time.perf_counter()
    d = straggler.draw_ms() if is_straggler else 0.0
    if d > 0:
        time.sleep(d / 1000)
    opt.zero_grad()
    loss = work.loss_fn(ddp(x), y)
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
    if settings.get("check_replicas"):
        checked += 1
        if not replicas_agree():
            mismatched += 1
            if first_mismatch is None:
                first_mismatch = step
    if step % settings["eval_every"] == 0 and step < work.total_steps:
        evaluate(step, epoch, every_rank=False)
evaluate(step, epoch, every_rank=True)

with open(out_path + ".params", "wb") as f:
    for p in model.parameters():
        f.write(p.detach().double().contiguous().numpy().tobytes())
result = {"rank": rank, "final_metric": evals[-1][3], "final_metric_se": evals[-1][4],
          "metric_name": work.metric_name, "steps": step, "train_s": train_s, "evals": evals,
          "step_ms": step_ms, "sync_ms": sync_ms, "delay_ms": delay_ms,
          "corpus_sha256": getattr(work, "digest", "")}
if settings.get("check_replicas"):
    result.update(checked_steps=checked, mismatched_steps=mismatched,
                  first_mismatch_step=first_mismatch)
if settings["import_optireduce"]:
    result["stats"] = optireduce.stats()  # noqa: F821  (imported above, before torch)
    result["config"] = optireduce.config()  # noqa: F821
dist.barrier()
dist.destroy_process_group()
with open(out_path, "w") as f:
    json.dump(result, f)
