"""The digits workload of tta_worker.py: an MLP (64 -> H -> H -> 10) on sklearn's digits.

H = 1024 makes the gradient ~4.5 MB, so with bucket_cap_mb = 2 each step allreduces a few
MiB-sized buckets (the allreduce, not the tiny compute, dominates a step, as on a large
model). 1 437 training and 360 test images (a fixed split); the metric is test accuracy
in %, so one image is 0.28 points.
"""

import torch
from sklearn.datasets import load_digits

TRAIN = 1437


class Workload:
    metric_name = "accuracy_pct"
    higher_is_better = True

    def __init__(self, settings, rank, world):
        digits = load_digits()
        x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
        y = torch.tensor(digits.target, dtype=torch.int64)
        perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(1234))
        test_idx, train_idx = perm[:360], perm[360:]
        self.x_train, self.y_train = x[train_idx], y[train_idx]
        self.x_test, self.y_test = x[test_idx], y[test_idx]
        self.rank, self.world = rank, world
        self.batch = settings["batch"]
        self.epochs = settings["epochs"]
        self.seed = settings["seed"]
        self.total_steps = self.epochs * ((len(self.x_train) // world) // self.batch)

    def model(self, settings):
        h = settings["hidden"]
        return torch.nn.Sequential(torch.nn.Linear(64, h), torch.nn.ReLU(),
                                   torch.nn.Linear(h, h), torch.nn.ReLU(),
                                   torch.nn.Linear(h, 10))

    def optimizer(self, params, settings):
        return torch.optim.SGD(params, lr=settings["lr"], momentum=0.9)

    def loss_fn(self, logits, y):
        return torch.nn.functional.cross_entropy(logits, y)

    def batches(self):
        """(epoch, x, y) per step: each epoch a seeded shuffle, rank r takes every world-th
        image. Every rank takes the same number of images (1437 do not split evenly): a rank
        with one batch more would wait in that step's allreduce for peers already done."""
        for epoch in range(self.epochs):
            order = torch.randperm(len(self.x_train), generator=torch.Generator().manual_seed(
                self.seed * 1000 + epoch))
            shard = order[self.rank::self.world][:len(self.x_train) // self.world]
            for i in range(0, len(shard) - self.batch + 1, self.batch):
                idx = shard[i:i + self.batch]
                yield epoch, self.x_train[idx], self.y_train[idx]

    def evaluate(self, model):
        """(test accuracy in %, its binomial standard error)."""
        with torch.no_grad():
            acc = (model(self.x_test).argmax(1) == self.y_test).double().mean().item()
        return acc * 100, (acc * (1 - acc) / len(self.y_test)) ** 0.5 * 100
