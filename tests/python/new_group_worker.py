"""One rank of a job with several process groups on one transport device.

Run by test_collectives.py:  new_group_worker.py RANK WORLD INIT_METHOD OUT_JSON
torch makes one Gloo device per process group (GLOO_DEVICE_TRANSPORT=DPDK: every one of a
process is the same DPDK device, see gloo_ext/devices.h). Each group reduces its own values,
one after the other and then all at once, so a packet delivered to the wrong group's
context shows up as a wrong sum. Writes {"rank", "checked", "stats"} to OUT_JSON.
"""

import json
import sys

rank, world, init_method, out_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
import optireduce  # noqa: F401  (must precede torch)

import datetime

import torch
import torch.distributed as dist
import keep_tensors  # noqa: E402  (this folder: tests/python)
keep_tensors.install()

dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=60))
everyone = list(range(world))
groups = {"default": None,
          "sub_a": dist.new_group(ranks=everyone),
          "sub_b": dist.new_group(ranks=everyone)}
# Distinct values per group (and rank): small integers, exact in any order.
offset = {"default": 1, "sub_a": 1000, "sub_b": 100000}


def values(name, r, n):
    return torch.arange(n, dtype=torch.float32) % 97 + offset[name] * (r + 1)


def expected(name, n):
    return sum(values(name, r, n) for r in range(world))


def check(what, got, want):
    if not torch.equal(got, want):
        bad = (got != want).nonzero()
        i = bad[0].item()
        raise AssertionError(f"rank {rank}: {what}: {bad.numel()} elements differ, first at "
                             f"{i}: got {got[i].item()} want {want[i].item()}")


checked = 0
# Each group on its own: small (eager) and large (rendezvous, many frames).
for n in (3, 1000, 1 << 18):
    for name, group in groups.items():
        t = values(name, rank, n)
        dist.all_reduce(t, group=group)
        check(f"{name} all_reduce n={n}", t, expected(name, n))
        checked += 1

# All groups at once, with the same tags in each group's context.
for n in (5000, 1 << 18):
    tensors = {name: values(name, rank, n) for name in groups}
    works = {name: dist.all_reduce(tensors[name], group=g, async_op=True)
             for name, g in groups.items()}
    for name, w in works.items():
        w.wait()
        check(f"{name} async all_reduce n={n}", tensors[name], expected(name, n))
        checked += 1

t = torch.full((10,), float(rank), dtype=torch.float32)
dist.broadcast(t, src=world - 1, group=groups["sub_b"])
check("sub_b broadcast", t, torch.full((10,), float(world - 1)))
checked += 1

result = {"rank": rank, "checked": checked, "stats": optireduce.stats()}
for g in (groups["sub_a"], groups["sub_b"]):
    dist.destroy_process_group(g)
dist.destroy_process_group()
with open(out_path, "w") as f:
    json.dump(result, f)
