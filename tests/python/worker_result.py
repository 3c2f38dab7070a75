"""What a training test worker does last: attach optireduce's counters to its result (None
when optireduce is not loaded: the stock Gloo baseline), leave the process group, and write
the result as JSON for the test (conftest.Job.results)."""

import json

import torch.distributed as dist
import keep_tensors  # noqa: E402  (this folder: tests/python)
keep_tensors.install()


def finish(result, out_path):
    try:
        import optireduce

        result["stats"] = optireduce.stats()
    except ImportError:
        result["stats"] = None
    dist.destroy_process_group()
    with open(out_path, "w") as f:
        json.dump(result, f)
