"""Entry point of the time-bounded child processes that measure the torch.compile peers.

    python -m benchmarks._child <module> '<json params>'      # started by harness.run_child, not by hand

torch.compile can take minutes, crash the process or hang; running it in a child that the parent kills at
its time budget keeps the suite alive and on time. The child imports ``benchmarks.<module>``, builds a
RunContext from the parameters (reps, warm-up, budget, device, configs) and calls the module's
``compile_child(ctx, params, emit)``, which emits one marked JSON line per row (harness.emit_row) as soon
as the row exists, so a timeout loses only the rows not yet measured. Log lines go to stderr.
"""
from __future__ import annotations

import faulthandler
import importlib
import json
import sys

from benchmarks import harness as H


def main(argv: list) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    module, params = argv[1], json.loads(argv[2])
    faulthandler.enable()
    # the parent kills this process group at its deadline; should the parent itself die first, this child
    # (its own session) must still end: dump stacks and exit a little after the deadline
    faulthandler.dump_traceback_later(float(params.get("budget_s", 60.0)) + 30.0, exit=True)
    mod = importlib.import_module(f"benchmarks.{module}")
    configs = params.get("configs")
    ctx = H.RunContext(budget=H.Budget(params.get("budget_s", 60.0)), reps=int(params.get("reps", 20)),
                       warmup=int(params.get("warmup", 2)), min_reps=int(params.get("min_reps", 3)),
                       quick=bool(params.get("quick", False)), device=params.get("device", "cuda"),
                       configs=frozenset(configs) if configs is not None else None,
                       log=lambda m: print(f"[child {module}] {m}", file=sys.stderr, flush=True))
    mod.compile_child(ctx, params, H.emit_row)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
