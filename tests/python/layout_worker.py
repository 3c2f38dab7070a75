"""One rank of a job that names Transpose AllReduce's layout through OPTIREDUCE_LAYOUT.

Run by test_layout.py:  layout_worker.py RANK WORLD INIT_METHOD OUT_JSON [OPS]
OPS allreduces (default 1) of 1 Mi float32 (above the small-message size, so TAR runs).
Writes {"rank", "error": the exception's message or null, "exact": whether the last
result is the exact sum, "max_error": its largest deviation from it, "sha256": of its
bytes, "stats": optireduce.stats()["optireduce"]} to OUT_JSON.
"""

import hashlib
import json
import sys

rank, world, init_method, out_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
ops = int(sys.argv[5]) if len(sys.argv) > 5 else 1
import optireduce  # noqa: F401  (must precede torch)

import datetime

import torch
import torch.distributed as dist
import keep_tensors  # noqa: E402  (this folder: tests/python)
keep_tensors.install()

dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=60))
want = float(world * (world + 1) // 2)
error, exact, max_error, digest = None, False, None, None
try:
    for _ in range(ops):
        t = torch.full((1 << 20,), float(rank + 1))
        dist.all_reduce(t)
    exact = bool(torch.all(t == want))
    max_error = float((t - want).abs().max())
    digest = hashlib.sha256(t.numpy().tobytes()).hexdigest()
except RuntimeError as e:
    error = str(e)
with open(out_path, "w") as f:
    json.dump({"rank": rank, "error": error, "exact": exact, "max_error": max_error,
               "sha256": digest, "stats": optireduce.stats()["optireduce"]}, f)
dist.destroy_process_group()
