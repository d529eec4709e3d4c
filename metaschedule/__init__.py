"""metaschedule: the tuner — design spaces, evolutionary search, cost models, database, builders
and runners (in the spirit of Apache TVM's MetaSchedule).

It sits between ``rpc`` and ``relax`` in the layering: it imports ``tensorir``, ``targets`` and
``rpc``, never ``relax`` (``relax.tune`` is the graph-level entry). See ``docs/tuning.md``.
"""
from .errors import TuneError

__all__ = ["TuneError"]

# --- SPACE: design space (schedule rules, postprocessors, mutators, space generator) ---------
from .schedule_rule import (AddRFactor, AutoBind, AutoInline, CrossThreadReduction,
                            MultiLevelTiling, MultiLevelTilingAMX, MultiLevelTilingDot4,
                            MultiLevelTilingWithIntrin, ParallelVectorizeUnroll,
                            RandomComputeLocation, ReuseConfig, ScheduleRule, SpaceContext)
from .postproc import (DisallowDynamicLoop, Postproc, RewriteCooperativeFetch,
                       RewritePackedLayout, RewriteParallelVectorizeUnroll,
                       RewriteReductionBlock, RewriteTensorize, RewriteUnboundBlock,
                       VerifyGPUCode)
from .mutator import (MutateComputeLocation, MutateParallel, MutateThreadBinding,
                      MutateTileSize, MutateUnroll, Mutator)
from .space_generator import SpaceGenerator, default_space
from .knob_space import Knob, KnobRule, KnobSpace, knob_values

__all__ += ["ScheduleRule", "SpaceContext", "AutoInline", "MultiLevelTiling",
            "MultiLevelTilingWithIntrin", "MultiLevelTilingDot4", "MultiLevelTilingAMX",
            "ReuseConfig",
            "ParallelVectorizeUnroll",
            "RandomComputeLocation", "CrossThreadReduction", "AddRFactor", "AutoBind",
            "Postproc", "DisallowDynamicLoop", "RewriteCooperativeFetch", "RewritePackedLayout",
            "RewriteParallelVectorizeUnroll", "RewriteReductionBlock", "RewriteTensorize",
            "RewriteUnboundBlock", "VerifyGPUCode", "Mutator", "MutateTileSize", "MutateUnroll",
            "MutateParallel", "MutateComputeLocation", "MutateThreadBinding", "SpaceGenerator",
            "default_space", "Knob", "KnobRule", "KnobSpace", "knob_values"]

# --- MEASURE: database, builder, runners ------------------------------------------------------
from .arg_info import ArgInfo, args_info, output_indices, random_inputs, reference_outputs
from .database import Database, TuningRecord, Workload, workload_hash

from .builder import BuilderInput, BuilderResult, LocalBuilder
from .runner import LocalRunner, RunnerInput, RunnerResult
from .rpc_runner import RPCRunner

__all__ += ["ArgInfo", "args_info", "output_indices", "random_inputs", "reference_outputs",
            "Database", "TuningRecord", "Workload", "workload_hash", "BuilderInput",
            "BuilderResult", "LocalBuilder", "LocalRunner", "RunnerInput", "RunnerResult",
            "RPCRunner"]

# --- SEARCH: cost model, search, task scheduler, tuning drivers -------------------------------
from .feature import FEATURE_NAMES, PerStoreFeature, count_flop, describe_features
from .cost_model import CostModel, RandomModel, XGBModel
from .search import EvolutionarySearch, TuneContext, compute_reference
from .task_scheduler import GradientTaskScheduler, RoundRobin, TaskScheduler
from .tune import Task, apply_best, baseline_record, tune_tasks, tune_tir
from .plot import plot_tuning_curve, tuning_curve

__all__ += ["PerStoreFeature", "FEATURE_NAMES", "describe_features", "count_flop",
            "CostModel", "XGBModel", "RandomModel", "EvolutionarySearch", "TuneContext",
            "compute_reference", "TaskScheduler", "GradientTaskScheduler", "RoundRobin", "Task",
            "tune_tir", "tune_tasks", "apply_best", "baseline_record", "plot_tuning_curve",
            "tuning_curve"]
