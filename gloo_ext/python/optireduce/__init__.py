"""optireduce for PyTorch's Gloo backend, without rebuilding PyTorch.

Import this package BEFORE torch:

    import optireduce            # loads liboptireduce_torch.so (RTLD_GLOBAL)
    import torch
    torch.distributed.init_process_group("gloo", ...)

Environment (read by the library, validated at import):
    GLOO_ALGO=ring|transpose|optireduce     which allreduce gloo::allreduce runs
    GLOO_DEVICE_TRANSPORT=UDP|DPDK          optireduce's datagram devices
    OPTIREDUCE_*                            see gloo_ext/README.md

Or, without importing it: LD_PRELOAD=<prefix>/lib/liboptireduce_torch.so python3 train.py.
"""

from ._library import ConfigError, library, library_path
from ._version import __version__

__all__ = [
    "__version__",
    "ConfigError",
    "RedisStore",
    "StoreTimeoutError",
    "config",
    "have_dpdk",
    "is_interposed",
    "library_path",
    "reset_stats",
    "stats",
    "sync_parameters",
]


def stats():
    """Counters of this process.

    Returns {"interposer": {...}, "optireduce": {...}, "transport": {...}, "interposed": bool}:
      interposer: calls (hook_calls of them from a patched Gloo's hook), tar_calls
        (GLOO_ALGO=transpose), optireduce_calls
        (GLOO_ALGO=optireduce), forwarded_calls (to stock Gloo) and why
        (forwarded_ring, forwarded_explicit_algorithm, forwarded_unsupported_type,
        forwarded_unsupported_op), errors, and bytes per path;
      optireduce: per-operation statistics of the bounded mode ({} until it reports any);
      transport: packets/bytes/retransmits/drops summed over the live UDP/DPDK devices
        this library created (devices: 0 means Gloo's own transport is in use);
      interposed: whether gloo::allreduce calls reach this library.
    """
    from ._library import json_call

    return json_call(library().optireduce_stats_json)


def sync_parameters(module, src=0, group=None):
    """Makes the parameters and buffers of `module` on every rank equal to rank `src`'s.

    A utility: OptiReduce mode needs no resynchronisation (every rank holds the same bytes
    after every allreduce; a deferred part is carried into the next operation on the same
    buffer, see algorithms/README.md). Useful to align replicas that were built apart, e.g.
    after loading different checkpoints. It is one torch.distributed.broadcast per dtype of
    flattened tensors — Gloo's broadcast over the reliable service, exact. The optimizer's
    own state (e.g. momentum) is not touched.
    """
    import torch
    import torch.distributed as dist

    groups = {}
    for t in list(module.parameters()) + list(module.buffers()):
        groups.setdefault((t.dtype, t.device), []).append(t)
    with torch.no_grad():
        for tensors in groups.values():
            flat = torch.cat([t.detach().reshape(-1) for t in tensors])
            dist.broadcast(flat, src, group=group)
            at = 0
            for t in tensors:
                t.copy_(flat[at:at + t.numel()].view_as(t))
                at += t.numel()


def reset_stats():
    """Sets every counter of stats() to zero."""
    library().optireduce_reset_stats()


def config():
    """The parsed environment configuration (dict), e.g. {"algo": "transpose", ...}."""
    from ._library import json_call

    return json_call(library().optireduce_config_json)


def have_dpdk():
    """True when this build has the DPDK device (GLOO_DEVICE_TRANSPORT=DPDK)."""
    return bool(library().optireduce_have_dpdk())


def is_interposed():
    """True when torch's gloo::allreduce calls go through this library."""
    return bool(library().optireduce_is_interposed())


def __getattr__(name):
    # RedisStore subclasses torch.distributed.Store, so it needs torch: import it only when
    # asked for (after `import optireduce` has loaded the library and torch is allowed).
    if name in ("RedisStore", "StoreTimeoutError"):
        from . import _redis_store

        return getattr(_redis_store, name)
    raise AttributeError(f"module 'optireduce' has no attribute {name!r}")
