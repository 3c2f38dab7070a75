"""One rank of a short DDP training: an MLP on sklearn's bundled digits data.

    ddp_digits_worker.py RANK WORLD INIT_METHOD OUT_JSON [--import-optireduce]

Small buckets (bucket_cap_mb) so several allreduces are in flight per step, like DDP's
25 MB buckets on a large model. Writes test accuracy and the optireduce counters.
"""

import sys

rank, world, init_method, out_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
if "--import-optireduce" in sys.argv:
    import optireduce  # noqa: F401
import datetime

import torch
import torch.distributed as dist
from sklearn.datasets import load_digits
from torch.nn.parallel import DistributedDataParallel as DDP

import worker_result  # noqa: E402  (this folder: tests/python)

torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=120))

digits = load_digits()
x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
y = torch.tensor(digits.target, dtype=torch.int64)
g = torch.Generator().manual_seed(1234)
perm = torch.randperm(len(x), generator=g)
test_idx, train_idx = perm[:360], perm[360:]
x_train, y_train = x[train_idx], y[train_idx]
x_test, y_test = x[test_idx], y[test_idx]

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                            torch.nn.Linear(128, 128), torch.nn.ReLU(),
                            torch.nn.Linear(128, 10))
# ~26K parameters = 104 KB; 0.025 MB buckets give several buckets per step (DDP puts up to
# _DEFAULT_FIRST_BUCKET_BYTES = 1 MB in the first bucket regardless: shrink that too).
dist._DEFAULT_FIRST_BUCKET_BYTES = 16 * 1024
ddp = DDP(model, bucket_cap_mb=0.025)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
loss_fn = torch.nn.CrossEntropyLoss()

batch = 32
steps = 0
# 15 epochs: the model is at its plateau (about 96.7% at 4 ranks), where a few
# contributions that OptiReduce mode defers by one step (a rank given up, a damaged part)
# move the test accuracy by about a point; after 5 epochs it is still climbing and ten
# such deferrals move it by up to 3 points.
for epoch in range(15):
    order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch))
    shard = order[rank::world]
    for i in range(0, len(shard) - batch + 1, batch):
        idx = shard[i:i + batch]
        opt.zero_grad()
        loss = loss_fn(ddp(x_train[idx]), y_train[idx])
        loss.backward()
        opt.step()
        steps += 1

with torch.no_grad():
    accuracy = (model(x_test).argmax(1) == y_test).float().mean().item() * 100

result = {"rank": rank, "accuracy": accuracy, "steps": steps}
worker_result.finish(result, out_path)
