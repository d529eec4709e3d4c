"""Mutators: how the search moves from a schedule to its neighbours (``Mutator`` subclasses,
each changing one kind of decision of a trace)."""
from .base import Mutator
from .mutate_compute_location import MutateComputeLocation
from .mutate_parallel import MutateParallel
from .mutate_thread_binding import MutateThreadBinding
from .mutate_tile_size import MutateTileSize
from .mutate_unroll import MutateUnroll

__all__ = ["Mutator", "MutateTileSize", "MutateUnroll", "MutateParallel",
           "MutateComputeLocation", "MutateThreadBinding"]
