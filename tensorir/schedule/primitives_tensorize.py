"""Schedule primitives: blockize, tensorize (and the intrinsic registry)."""
from __future__ import annotations


class TensorizePrimitives:
    """Mixin of ``Schedule``: blockize, tensorize (and the intrinsic registry)."""
