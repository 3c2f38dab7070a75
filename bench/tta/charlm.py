"""The character-level language model workload of tta_worker.py: a small causal
transformer trained on Python's standard-library sources, as Debian ships them.

Data: the files FILES of the Python standard library (python3.11 on Debian 12:
/usr/lib/python3.11, packages libpython3.11-minimal and libpython3.11-stdlib), read as
bytes in this order; every byte above 127 becomes 0 (the sources have no NUL, so 0 means
"not ASCII"), a vocabulary of 128. Files at positions 7, 15, 23, ... (every 8th) are the
validation text, the others the training text: no validation character is ever trained
on. corpus_digest() is the SHA-256 of the bytes read, in order, so two machines can check
that they trained on the same data (a distribution that patched one of these files, or
another Python version, gives another digest; the summary reports it).

Validation: VAL_WINDOWS windows of context + 1 characters at evenly spaced offsets of the
validation text (no random draw); the metric is the mean next-character cross-entropy in
nats over every position of every window. Its sampling error is the standard deviation of
the per-window losses over sqrt(VAL_WINDOWS) (val_loss_se).
"""

import hashlib
import os

import torch

STDLIB_DIR = "/usr/lib/python3.11"
FILES = ["_collections_abc.py", "_pydecimal.py", "_pyio.py", "_strptime.py", "argparse.py",
         "ast.py", "bdb.py", "calendar.py", "codecs.py", "contextlib.py", "dataclasses.py",
         "datetime.py", "difflib.py", "dis.py", "doctest.py", "enum.py", "fractions.py",
         "functools.py", "heapq.py", "inspect.py", "locale.py", "optparse.py", "pdb.py",
         "pickle.py", "pickletools.py", "pprint.py", "profile.py", "pstats.py", "pydoc.py",
         "random.py", "statistics.py", "string.py", "textwrap.py", "threading.py",
         "tokenize.py", "trace.py", "traceback.py", "turtle.py", "typing.py"]
# SHA-256 of FILES as Debian 12's python3.11 (3.11.2-6+deb12u6) installs them.
DEBIAN12_SHA256 = "81595fa8899c1369e564f5376b0f5f4ec914397f544b9e871b60bb7a4c3f7489"
VAL_EVERY = 8
VAL_WINDOWS = 256
VOCAB = 128


class DataError(Exception):
    """The corpus cannot be read (message names the file and why)."""


def read_corpus(stdlib_dir=STDLIB_DIR):
    """(train bytes, validation bytes, sha256 hex of every file's bytes in FILES order)."""
    train, val = bytearray(), bytearray()
    digest = hashlib.sha256()
    for i, name in enumerate(FILES):
        path = os.path.join(stdlib_dir, name)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise DataError("charlm: cannot read %s (%s): the workload trains on Python 3.11's "
                            "standard library as Debian 12 installs it (libpython3.11-stdlib)"
                            % (path, e.strerror)) from None
        digest.update(data)
        (val if i % VAL_EVERY == VAL_EVERY - 1 else train).extend(data)
    return bytes(train), bytes(val), digest.hexdigest()


def check_corpus(stdlib_dir=STDLIB_DIR):
    """Raises DataError naming the first file of FILES that is not a readable file."""
    for name in FILES:
        path = os.path.join(stdlib_dir, name)
        if not os.access(path, os.R_OK) or not os.path.isfile(path):
            raise DataError("charlm: %s is missing or unreadable: the workload trains on "
                            "Python 3.11's standard library as Debian 12 installs it "
                            "(libpython3.11-stdlib)" % path)


def encode(data):
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(torch.int64)
    t[t >= VOCAB] = 0
    return t


class CharLM(torch.nn.Module):
    """Token + learned position embeddings, `layers` pre-norm transformer encoder layers
    with a causal mask, a final layer norm and a linear head onto the 128 characters."""

    def __init__(self, context, d_model, layers, heads):
        super().__init__()
        self.tok = torch.nn.Embedding(VOCAB, d_model)
        self.pos = torch.nn.Parameter(torch.zeros(context, d_model))
        torch.nn.init.normal_(self.pos, std=0.02)
        layer = torch.nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=4 * d_model,
                                                 dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(d_model)
        self.head = torch.nn.Linear(d_model, VOCAB)
        mask = torch.triu(torch.full((context, context), float("-inf")), diagonal=1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x):
        n = x.shape[1]
        h = self.tok(x) + self.pos[:n]
        h = self.blocks(h, mask=self.mask[:n, :n])
        return self.head(self.norm(h))


class Workload:
    """What tta_worker.py trains: batches for a rank and step, the metric (validation loss
    in nats, lower is better)."""

    metric_name = "val_loss"
    higher_is_better = False

    def __init__(self, settings, rank, world):
        train, val, self.digest = read_corpus(settings.get("stdlib_dir", STDLIB_DIR))
        self.train = encode(train)
        self.val = encode(val)
        self.context = settings["context"]
        self.batch = settings["batch"]
        self.rank, self.world = rank, world
        self.seed = settings["seed"]
        n = VAL_WINDOWS
        span = len(self.val) - self.context - 1
        offsets = [i * span // (n - 1) for i in range(n)]
        self.val_windows = torch.stack([self.val[o:o + self.context + 1] for o in offsets])
        self.steps = self.total_steps = settings["steps"]

    def model(self, settings):
        return CharLM(self.context, settings["d_model"], settings["layers"], settings["heads"])

    def optimizer(self, params, settings):
        return torch.optim.Adam(params, lr=settings["lr"])

    def loss_fn(self, logits, y):
        return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))

    def batches(self):
        """(epoch, x, y) for every step: `batch` windows per rank drawn uniformly from the
        training text, a different stream per (seed, rank)."""
        g = torch.Generator().manual_seed(self.seed * 1000 + self.rank)
        hi = len(self.train) - self.context - 1
        for _ in range(self.steps):
            starts = torch.randint(0, hi, (self.batch,), generator=g)
            w = torch.stack([self.train[s:s + self.context + 1] for s in starts.tolist()])
            yield 0, w[:, :-1], w[:, 1:]

    def evaluate(self, model):
        """(mean validation loss, its standard error) in nats."""
        was = model.training
        model.eval()
        per_window = []
        with torch.no_grad():
            for chunk in self.val_windows.split(64):
                logits = model(chunk[:, :-1])
                loss = torch.nn.functional.cross_entropy(
                    logits.reshape(-1, VOCAB), chunk[:, 1:].reshape(-1), reduction="none")
                per_window.append(loss.view(chunk.shape[0], -1).mean(1))
        model.train(was)
        w = torch.cat(per_window).double()
        return w.mean().item(), (w.std() / len(w) ** 0.5).item()
