"""The benchmark harness: everything the bench_*.py files, run_all.py, report.py, plots.py and _child.py
share, one module per job. A bench file defines its workload and its peers; the harness measures, checks,
writes and prints.

    from benchmarks import harness as H           # H.time_reps, H.RunContext, H.write_results, ...
    from benchmarks.harness import time_reps      # the same names, one at a time

Layers, bottom first; a module imports only modules of earlier lines (no cycles; checked by
tests/test_cpu_benchmarks.py), and none imports run_all, report, plots or a bench file:

    env        paths (REPO_ROOT, RESULTS_DIR), device / driver / torch / git sha ($GPUOS_GIT_SHA wins),
               result-file metadata, the no-GPU exits, the watchdog
    timing     Timing, time_reps, syncs, CUDA-graph capture, gated GPU time (gpu_ms_of), release_memory
    progress   Progress (rich / tqdm / plain), prefixed log lines
    cli        list / shape / capacity / --configs parsing and the standalone benchmarks' common options
    rows       rows in the BENCH_SCHEMA.md shape, lookups (find_row, row_median, ratio)     <- timing (types)
    table      fmt_num / fmt_ratio, print_table, the header and speedup table              <- rows
    goals      speedup / value goals and their table                                      <- rows, table
    results    write / merge / load result files, gpuos_vs_best_peer                       <- env, rows
    gpuos_rt   import / (re)init the GPUOS runtime, its counters and their deltas          <- env, rows
    suite      Budget, plan_reps, Case, Prepared, RunContext, measure_config, peer_sweep   <- timing, rows, gpuos_rt
    batch      check-then-time of the batch benchmarks (W1, W3): poison, chunked check    <- timing, rows, gpuos_rt
    child      torch.compile peers in a child process, CompileCounters, compile_sweep     <- env, timing, rows,
                                                                                             results, suite
    workload   run_standard_workload, standard_hooks (the suite hooks of W2, W4-W6)       <- rows, suite, child

Nothing here imports torch at import time (report.py and plots.py run without it).

Module loading: every process of the suite runs with CUDA_MODULE_LOADING=EAGER unless the caller chose, the mode
`import gpuos` sets when it comes before CUDA starts. A bench file reads the device name (CUDA starts) before it
imports gpuos, which left the runtime in lazy mode (every publication behind busy stream work drained the
worker: W2 measured 1.69x eager that way on an H100). The setting applies to every peer of the process alike.
"""
from __future__ import annotations

import os as _os

_os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")

from .env import (BENCH_DIR, REPO_ROOT, RESULTS_DIR, cuda_available, device_name, driver_version,
                  ensure_repo_on_path, env_line, env_metadata, git_sha, no_cuda_reason, require_cuda,
                  skip_without_cuda, start_watchdog, utc_now_iso)
from .timing import (Timing, capture_cuda_graph, cuda_sync, events_ms, gate_for, gpu_ms_of, no_sync,
                     release_memory, summarize, time_reps, try_sync)
from .progress import Progress, prefixed_log
from .cli import (add_configs_arg, add_output_args, add_reps_args, add_watchdog_arg, new_parser,
                  parse_capacity, parse_int_list, parse_shapes, pow2_at_least, select_configs, shape_str)
from .rows import (error_row, find_row, format_exc, incorrect, sweep, is_gpuos_config, not_applicable_row,
                   per_op_fields, per_op_us_row, ratio, rnd, row_median, spread_us, timing_row, value_row)
from .table import SPEEDUP_HEADERS, fmt_num, fmt_ratio, print_header, print_table, speedup_table
from .goals import print_goals, speedup_goal, value_goal
from .results import (gpuos_vs_best_peer, group_key, json_default, load_result_docs,
                      merge_and_print_values, merge_results, result_path, sanitize, save_results, timed_rows,
                      write_results)
from .gpuos_rt import (add_stats_delta, check_one_batch, gpuos_reinit, gpuos_stats, gpuos_unavailable,
                       import_gpuos, import_gpuos_package, import_gpuos_reduce, init_gpuos, is_fatal_gpuos_error,
                       stats_delta)
from .suite import (Budget, Case, Prepared, RunContext, budget_error, check_close, measure_config,
                    capture_program, grid_main, peer_sweep, plan_reps, program_setup, scheduler_setup,
                    settle_program, whole_build_extra, worker_tasks)
from .batch import bench_config, check_batch, check_then_time, poison, run_checked
from .child import (CHILD_MARK, COMPILE_MODES, MIN_CHILD_S, CompileCounters, child_rows,
                    compile_sweep, emit_row, mark_static, reset_dynamo, run_child)
from .workload import run_standard_workload, standard_hooks, standard_units

LAYERS = ("env", "timing", "progress", "cli", "rows", "table", "goals", "results", "gpuos_rt", "suite", "batch",
          "child", "workload")  # the modules, bottom layer first (see above)

__all__ = [
    "BENCH_DIR", "REPO_ROOT", "RESULTS_DIR", "cuda_available", "device_name", "driver_version",
    "ensure_repo_on_path", "env_line", "env_metadata", "git_sha", "no_cuda_reason", "require_cuda",
    "skip_without_cuda", "start_watchdog", "utc_now_iso", "Timing", "capture_cuda_graph", "cuda_sync", "gate_for",
    "gpu_ms_of", "events_ms", "no_sync", "release_memory", "summarize", "time_reps", "try_sync", "Progress", "prefixed_log",
    "add_configs_arg", "add_output_args", "add_reps_args", "add_watchdog_arg", "new_parser", "parse_capacity",
    "parse_int_list", "parse_shapes", "pow2_at_least", "select_configs", "shape_str", "error_row", "find_row",
    "format_exc", "incorrect", "sweep", "is_gpuos_config", "not_applicable_row", "per_op_fields", "per_op_us_row", "ratio",
    "rnd", "row_median", "spread_us", "timing_row", "value_row", "SPEEDUP_HEADERS", "fmt_num", "fmt_ratio",
    "print_header", "print_table", "speedup_table", "print_goals", "speedup_goal", "value_goal",
    "gpuos_vs_best_peer", "group_key", "json_default", "load_result_docs", "merge_and_print_values",
    "merge_results", "result_path", "sanitize", "save_results", "timed_rows", "write_results", "add_stats_delta",
    "check_one_batch", "gpuos_reinit", "gpuos_stats", "gpuos_unavailable", "import_gpuos", "import_gpuos_package",
    "import_gpuos_reduce", "init_gpuos", "is_fatal_gpuos_error", "stats_delta", "Budget", "Case", "Prepared",
    "RunContext", "budget_error", "capture_program", "check_close", "measure_config", "grid_main", "peer_sweep", "plan_reps",
    "program_setup", "scheduler_setup", "settle_program", "whole_build_extra", "worker_tasks",
    "bench_config", "check_batch", "check_then_time", "poison", "run_checked", "CHILD_MARK", "COMPILE_MODES",
    "MIN_CHILD_S", "CompileCounters", "child_rows", "compile_sweep", "emit_row", "mark_static", "reset_dynamo",
    "run_child", "run_standard_workload", "standard_hooks", "standard_units",
]
