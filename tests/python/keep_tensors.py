"""Keeps every object a worker passes to a torch.distributed call alive until the process
exits, so that dist.destroy_process_group() cannot deadlock on torch 2.6.

torch 2.6's ProcessGroupGloo destructor joins its worker threads while the caller holds
the GIL; a worker thread that still holds a finished operation drops its tensors there,
and dropping the last reference to a tensor Python created needs the GIL: the destructor
waits forever (a stock torch race, fixed in later torch; it happens without optireduce
too). With Python holding every such tensor, the worker's reference is never the last.
Workers call install() right after importing torch.distributed."""

import torch.distributed as dist

_kept = []
CALLS = ("all_reduce", "all_reduce_coalesced", "broadcast", "all_gather", "gather", "scatter",
         "reduce", "all_to_all", "all_to_all_single", "send", "recv", "isend", "irecv",
         "batch_isend_irecv", "P2POp", "all_gather_into_tensor", "reduce_scatter",
         "broadcast_object_list", "all_gather_object")


def install():
    for name in CALLS:
        call = getattr(dist, name, None)
        if call is None or getattr(call, "_keeps_tensors", False):
            continue

        def keeping(*args, _call=call, **kwargs):
            _kept.append((args, kwargs))
            return _call(*args, **kwargs)

        keeping._keeps_tensors = True
        setattr(dist, name, keeping)


def keep(obj):
    """Keeps obj (tensors passed to a call that install() does not wrap) until exit."""
    _kept.append(obj)
