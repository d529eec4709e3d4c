"""``tilecraft tune``: tune a model's kernels with ``relax.tune``, resumable, here or on boards."""
from __future__ import annotations

import os
import shlex

from tilecraft import metaschedule, relax
from tilecraft.metaschedule.tune import DEFAULT_REMEASURE

from ..errors import CLIError
from ..progress import Steps
from ..remote import add_rpc_arguments, board_from_args, check_runs_on
from ..tuning import choices_table, kernel_choices, summary_line, trials_done
from .common import add_model_args, import_model, parse_target

DESCRIPTION = """\
Tune every kernel of a model with relax.tune: search schedules, measure them, and keep the
records in the work directory (a metaschedule.Database). --trials is the budget of the work
directory in all: run the same command again and it continues from the records there (a run
that was interrupted finishes its budget; a larger --trials tunes further) instead of
starting over. Then `tilecraft compile MODEL --tuning-db DIR` builds with the records.

Measured here by default. With --rpc-tracker and --rpc-key, candidates are cross-compiled here
for --target (the board's, e.g. raspberry-pi/4b-aarch64) and measured on every free board of
that key (metaschedule.RPCRunner; start the boards with `tilecraft rpc server --tracker ...
--key KEY`).

examples:
  tilecraft tune model.onnx --trials 500 --work-dir tune/
  tilecraft tune model.onnx --trials 1000 --work-dir tune/          # 500 more, same records
  tilecraft tune model.onnx --target raspberry-pi/4b-aarch64 --trials 500 --work-dir tune-pi/ \\
      --rpc-tracker 192.168.1.10:9190 --rpc-key rasp4"""


def add_arguments(p) -> None:
    add_model_args(p)
    p.add_argument("--trials", type=int, required=True, metavar="N",
                   help="trials (measured candidates) in the work directory in all")
    p.add_argument("--work-dir", required=True, metavar="DIR",
                   help="where the records go; the same directory resumes")
    p.add_argument("--per-batch", type=int, default=64, metavar="N",
                   help="candidates measured per batch (default 64)")
    p.add_argument("--population", type=int, default=128, metavar="N",
                   help="the evolutionary search's population (default 128; smaller is "
                        "faster and searches less)")
    p.add_argument("--remeasure", type=int, default=DEFAULT_REMEASURE, metavar="N",
                   help=f"re-measure each kernel's N best records against its default "
                        f"schedule at the end (default {DEFAULT_REMEASURE}; 0: off)")
    p.add_argument("--seed", type=int, help="the search's random seed")
    add_rpc_arguments(p, direct=False)


def _runner(board, args, target):
    """``metaschedule.RPCRunner`` on the boards of ``--rpc-key``, checked first; None: here."""
    if board is None:
        return None
    with board.connect() as sess:   # a clear error now rather than failed trials later
        check_runs_on(str(target), target.triple, sess, board, f"--target {args.target}",
                      "give the board's --target")
    return metaschedule.RPCRunner(board.tracker, board.key, token=board.token,
                                  tracker_token=board.tracker_token,
                                  request_timeout=board.timeout)


def run(args) -> int:
    target = parse_target(args.target)
    for option, value, low in (("--trials", args.trials, 1), ("--per-batch", args.per_batch, 1),
                               ("--population", args.population, 1),
                               ("--remeasure", args.remeasure, 0)):
        if value < low:
            raise CLIError(f"{option} {value}: must be >= {low}")
    if os.path.exists(args.work_dir) and not os.path.isdir(args.work_dir):
        raise CLIError(f"--work-dir {args.work_dir}: not a directory")
    board = board_from_args(args)
    runner = _runner(board, args, target)
    with Steps(2, "tune", quiet=args.quiet) as steps:
        model, bounds = import_model(args, steps)
        steps.step("finding the kernels")
        db = metaschedule.Database(args.work_dir)
        tasks = relax.extract_tasks(model.mod, target, upper_bounds=bounds or None,
                                    database=db)
    done = trials_done(tasks, db, target)
    where = f"on {board.describe()}" if runner is not None else "here"
    n = len(tasks)
    print(f"{args.model}: {n} distinct kernel{'s' if n != 1 else ''} to tune for {target}, "
          f"measured {where}; "
          f"{args.work_dir} holds {done} trials of them"
          + (" (resuming)" if 0 < done < args.trials else ""))
    if done >= args.trials:
        print(f"nothing to tune: {done} >= --trials {args.trials} (give a larger --trials to "
              f"tune further)")
    else:
        try:
            db = relax.tune(model.mod, target, max_trials=args.trials - done,
                            work_dir=args.work_dir, runner=runner,
                            upper_bounds=bounds or None, num_trials_per_iter=args.per_batch,
                            search={"population_size": args.population},
                            remeasure=args.remeasure, seed=args.seed, progress=not args.quiet)
        finally:
            if runner is not None:
                runner.close()
    # the tasks again: relax.tune's layout decisions (relax.tune_layouts) choose the kernels
    tasks = relax.extract_tasks(model.mod, target, upper_bounds=bounds or None, database=db)
    choices = kernel_choices(tasks, db, target)
    print(choices_table(choices))
    print(f"{trials_done(tasks, db, target)} trials in {args.work_dir}; {summary_line(choices)}")
    same = "".join(f" --shape {shlex.quote(s)}" for s in args.shape or []) + \
        "".join(f" --upper-bound {shlex.quote(b)}" for b in args.upper_bound or [])
    print(f"build with them: tilecraft compile {shlex.quote(args.model)} --target "
          f"{shlex.quote(args.target)}{same} --tuning-db {shlex.quote(args.work_dir)} "
          f"-o MODEL.tcx")
    return 0
