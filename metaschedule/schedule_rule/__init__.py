"""Schedule rules: what a design space is made of (``ScheduleRule`` subclasses, applied by
``SpaceGenerator`` to each block in turn)."""
from .add_rfactor import AddRFactor
from .auto_bind import AutoBind
from .auto_inline import AutoInline
from .base import ScheduleRule, SpaceContext
from .cross_thread_reduction import CrossThreadReduction
from .multi_level_tiling import MultiLevelTiling, MultiLevelTilingWithIntrin, ReuseConfig
from .multi_level_tiling_amx import MultiLevelTilingAMX, has_amx
from .multi_level_tiling_dot4 import MultiLevelTilingDot4, has_dot_instruction
from .parallel_vectorize_unroll import ParallelVectorizeUnroll
from .random_compute_location import RandomComputeLocation

__all__ = ["ScheduleRule", "SpaceContext", "AutoInline", "MultiLevelTiling",
           "MultiLevelTilingWithIntrin", "MultiLevelTilingDot4", "has_dot_instruction",
           "MultiLevelTilingAMX", "has_amx",
           "ReuseConfig", "ParallelVectorizeUnroll",
           "RandomComputeLocation", "CrossThreadReduction", "AddRFactor", "AutoBind"]
