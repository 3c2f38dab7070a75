"""One rank of a job exercising torch.distributed's point-to-point calls and monitored_barrier.

Run by test_p2p.py:  p2p_worker.py RANK WORLD INIT_METHOD OUT_JSON
The same job runs over Gloo's TCP transport and over optireduce's; the test compares what
every rank observed. Every scenario runs in its own process group (a failed barrier leaves
its group's context unusable, as over Gloo's TCP, and the next scenario must not inherit
that). Writes {"rank", "seen": {scenario: [...]}} to OUT_JSON: the values and source ranks
received, or for a call that raised, the exception's type and the ranks its message names.
"""

import json
import re
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
store = dist.distributed_c10d._get_default_store()
seen = []
group = None


# The clause optireduce's transport adds when a third rank passed the news of the failure
# on ("peer rank 0 is gone (rank 1's context failed on it and closed its connection)"): it
# names the messenger, not a rank that failed, and which peer's notice comes first is a race.
RELAYED_BY = re.compile(r"\(rank \d+'s context failed on it[^)]*\)")


def failure(e):
    """An exception as its type and the ranks its message names as failed (the wording
    differs between transports; who failed must not)."""
    text = RELAYED_BY.sub("", str(e))
    named = sorted({int(x) for group in re.findall(r"[Rr]anks? ((?:\d+(?:, )?)+)", text)
                    for x in group.split(", ")})
    return {"raised": type(e).__name__, "ranks": named, "message": str(e)[:300]}


def value(r, k=0):
    return torch.full((4,), float(100 * (r + 1) + k))


def p2p():
    # recv without src (recv_anysource over the whole group, this rank included).
    if rank == 0:
        got = []
        for _ in range(world - 1):
            t = torch.zeros(4)
            src = dist.recv(t, group=group)
            got.append([src, t[0].item()])
        seen.append(["recv_any", sorted(got)])
    else:
        dist.send(value(rank), 0, group=group)
    # irecv without src, isend (each phase on its own tag: a later phase's message must not
    # meet an earlier phase's recv-from-any).
    if rank == 0:
        works = []
        bufs = [torch.zeros(4) for _ in range(world - 1)]
        for b in bufs:
            works.append(dist.irecv(b, tag=2, group=group))
        for w in works:
            w.wait()
        seen.append(["irecv_any", sorted(b[0].item() for b in bufs)])
    else:
        dist.isend(value(rank, 1), 0, tag=2, group=group).wait()
    # A ring of isend/irecv.
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    t = torch.zeros(4)
    r = dist.irecv(t, src=prv, tag=3, group=group)
    s = dist.isend(value(rank, 2), nxt, tag=3, group=group)
    s.wait()
    r.wait()
    seen.append(["ring", t[0].item()])
    # batch_isend_irecv with tags: two messages to every peer, posted in opposite orders.
    ops, bufs = [], {}
    for peer in range(world):
        if peer == rank:
            continue
        for tag in (12, 11):
            ops.append(dist.P2POp(dist.isend, value(rank, 10 * peer + tag), peer, group, tag))
        for tag in (11, 12):
            bufs[(peer, tag)] = torch.zeros(4)
            ops.append(dist.P2POp(dist.irecv, bufs[(peer, tag)], peer, group, tag))
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    seen.append(["batch", sorted([p, tag, b[0].item()] for (p, tag), b in bufs.items())])


def barrier(name, wait_all, absent):
    if rank in absent:
        seen.append(["skipped"])
    else:
        try:
            dist.monitored_barrier(group=group, timeout=datetime.timedelta(seconds=3),
                                   wait_all_ranks=wait_all)
            seen.append(["passed"])
        except Exception as e:  # noqa: BLE001  (the outcome is what is compared)
            seen.append(failure(e))
    # Every rank leaves only when all have finished the barrier (an absent rank must not
    # disappear under the others: that is peer failure, not what is compared here).
    store.set(f"{name}/done{rank}", "1")
    store.wait([f"{name}/done{r}" for r in range(world)], datetime.timedelta(seconds=120))


SCENARIOS = {
    "p2p": p2p,
    "barrier": lambda: barrier("barrier", False, []),
    "barrier_wait_all": lambda: barrier("barrier_wait_all", True, []),
    "barrier_missing": lambda: barrier("barrier_missing", False, [world - 1]),
    "barrier_missing_wait_all": lambda: barrier("barrier_missing_wait_all", True,
                                                list(range(1, world))),
}
results = {}
for name, run in SCENARIOS.items():
    # A present rank that waits for a failed rank 0 raises when rank 0's transport gives up
    # on the pair, at the latest after the group's timeout.
    group = dist.new_group(ranks=list(range(world)), timeout=datetime.timedelta(seconds=20))
    seen = []
    try:
        run()
    except Exception as e:  # noqa: BLE001
        seen.append(failure(e))
    results[name] = seen

try:
    dist.destroy_process_group()
except Exception as e:  # noqa: BLE001
    results["destroy"] = [failure(e)]
with open(out_path, "w") as f:
    json.dump({"rank": rank, "seen": results}, f)
