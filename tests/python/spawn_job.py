"""A torch.multiprocessing.spawn job with `import optireduce` at the top of the main module:
spawned children re-import the main module (so optireduce again precedes torch) before they
unpickle the target. Prints "RANK tar_calls transport_devices" per rank."""

import optireduce  # noqa: F401  (first import)

import os
import sys
import tempfile

import torch
import torch.distributed as dist
import keep_tensors  # noqa: E402  (this folder: tests/python)
keep_tensors.install()
import torch.multiprocessing as mp


def run(rank, world, path):
    dist.init_process_group("gloo", init_method="file://" + path, rank=rank, world_size=world)
    t = torch.ones(1000) * (rank + 1)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((1000,), float(world * (world + 1) // 2)))
    s = optireduce.stats()
    # One write(2) per line: the spawned ranks share the pipe, and a short write is atomic.
    line = f'{rank} {s["interposer"]["tar_calls"]} {s["transport"]["devices"]}\n'
    os.write(1, line.encode())
    dist.destroy_process_group()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(run, args=(2, d + "/store"), nprocs=2)
