"""One rank of a few DDP steps with PyTorch's default buckets (bucket_cap_mb=25) on a model
of ~28 MB of gradients, so that one gloo::allreduce carries a full 25 MB bucket.

    ddp_big_bucket_worker.py RANK WORLD INIT_METHOD OUT_JSON [--import-optireduce]

Writes the parameters' fingerprint (per tensor: sum and 8 sampled values, as float64), the
number of steps and the optireduce counters.
"""

import sys

rank, world, init_method, out_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
if "--import-optireduce" in sys.argv:
    import optireduce  # noqa: F401  (must precede torch)
import datetime

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import worker_result  # noqa: E402  (this folder: tests/python)

torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=120))

torch.manual_seed(0)  # the same initial model on every rank and in every run
model = torch.nn.Sequential(torch.nn.Linear(64, 2048), torch.nn.ReLU(),
                            torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
                            torch.nn.Linear(2048, 1280), torch.nn.ReLU(),
                            torch.nn.Linear(1280, 10))
grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
assert grad_bytes > 25 * 1024 * 1024, grad_bytes  # more than one default bucket
ddp = DDP(model)  # PyTorch's defaults: bucket_cap_mb=25
opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
loss_fn = torch.nn.CrossEntropyLoss()

data = torch.Generator().manual_seed(100 + rank)  # each rank its own batch
steps = 3
for _ in range(steps):
    x = torch.randn(16, 64, generator=data)
    y = torch.randint(0, 10, (16,), generator=data)
    opt.zero_grad()
    loss_fn(ddp(x), y).backward()
    opt.step()

idx = torch.arange(8) * 997
fingerprint = []
with torch.no_grad():
    for p in model.parameters():
        flat = p.detach().flatten().to(torch.float64)
        fingerprint.append([flat.sum().item()] + flat[idx % flat.numel()].tolist())

result = {"rank": rank, "steps": steps, "grad_bytes": grad_bytes, "fingerprint": fingerprint}
worker_result.finish(result, out_path)
