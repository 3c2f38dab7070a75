"""Delay distributions for stragglers, spelled as in optireduce-bench's
--straggler-ms-dist: none, const:X, exp:MEAN, uniform:A:B, normal:MEAN:STD,
pareto:SCALE:SHAPE, spike:P:MS (with probability P a delay of MS, else none) (all in
milliseconds; negative draws become 0)."""

import random

_ARITY = {"none": 0, "const": 1, "exp": 1, "uniform": 2, "normal": 2, "pareto": 2, "spike": 2}


def parse(spec, what="--straggler-ms-dist"):
    """Returns (kind, params); raises ValueError naming `what` and the allowed forms."""
    allowed = "none, const:X, exp:MEAN, uniform:A:B, normal:MEAN:STD, pareto:SCALE:SHAPE, spike:P:MS (ms)"
    parts = spec.split(":")
    kind = parts[0]
    if kind not in _ARITY or len(parts) - 1 != _ARITY[kind]:
        raise ValueError("%s: '%s' is not a distribution; allowed: %s" % (what, spec, allowed))
    try:
        params = [float(p) for p in parts[1:]]
    except ValueError:
        raise ValueError("%s: '%s' has a parameter that is not a number; allowed: %s"
                         % (what, spec, allowed)) from None
    if any(p < 0 for p in params) or (kind == "pareto" and params[1] <= 0) or \
            (kind == "uniform" and params[0] > params[1]) or (kind == "spike" and params[0] > 1):
        raise ValueError("%s: '%s' has a parameter out of range (need non-negative values, "
                         "A <= B, SHAPE > 0, P <= 1)" % (what, spec))
    return kind, params


class Sampler:
    """Seeded draws (ms) from a parsed distribution."""

    def __init__(self, spec, seed):
        self.kind, self.params = parse(spec)
        self.rng = random.Random(seed)

    def draw_ms(self):
        k, p, r = self.kind, self.params, self.rng
        if k == "none":
            return 0.0
        if k == "const":
            return p[0]
        if k == "exp":
            return r.expovariate(1.0 / p[0]) if p[0] > 0 else 0.0
        if k == "uniform":
            return r.uniform(p[0], p[1])
        if k == "normal":
            return max(0.0, r.gauss(p[0], p[1]))
        if k == "spike":
            return p[1] if r.random() < p[0] else 0.0
        return p[0] * r.paretovariate(p[1])  # pareto: scale * Pareto(shape), >= scale
