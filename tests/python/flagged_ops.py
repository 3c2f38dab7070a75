"""Counts of OptiReduce-mode operations whose result is not the call's exact sum by design:
damaged (a rank later than the start grace was left out, the same on every rank) or
carried_in (a part deferred earlier on the same buffer came back). Workers check exactly
only the calls during which neither count moved."""

import os


def flagged():
    """(damaged_ops, carried_in_ops) so far; (0, 0) when GLOO_ALGO is not optireduce."""
    if os.environ.get("GLOO_ALGO", "").lower() != "optireduce":
        return (0, 0)
    import optireduce

    c = (optireduce.stats().get("optireduce") or {}).get("cumulative") or {}
    return c.get("damaged_ops", 0), c.get("carried_in_ops", 0)
