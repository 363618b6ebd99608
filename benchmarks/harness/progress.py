"""Progress display (rich / tqdm on a terminal, plain lines otherwise) and a benchmark's log lines.

Imports nothing from the harness.
"""
from __future__ import annotations

import sys
import time
from typing import Callable


def prefixed_log(name: str) -> Callable[[str], None]:
    """A log function printing ``[name] msg`` (flushed at once)."""
    def log(msg: str) -> None:
        print(f"[{name}] {msg}", flush=True)
    return log


class Progress:
    """A progress display: rich or tqdm on a terminal when importable, else plain lines.

    ``kind``: "auto" (rich, then tqdm, on a TTY; plain otherwise), "rich", "tqdm" or "plain".
    ``log`` prints a line above the bar; ``advance`` moves the bar and names the current step.
    """

    def __init__(self, total: int, kind: str = "auto", desc: str = "benchmarks") -> None:
        self.total, self.done, self.kind = max(1, int(total)), 0, "plain"
        self._t0 = time.perf_counter()
        self._bar = None
        order = {"auto": ("rich", "tqdm") if sys.stdout.isatty() else (), "rich": ("rich",),
                 "tqdm": ("tqdm",), "plain": ()}[kind]
        for k in order:
            try:
                if k == "rich":
                    from rich.progress import (BarColumn, MofNCompleteColumn, Progress as RichProgress,
                                               TextColumn, TimeElapsedColumn)
                    bar = RichProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                       TimeElapsedColumn())
                    bar.start()
                    self._task = bar.add_task(desc, total=self.total)
                else:
                    from tqdm import tqdm
                    bar = tqdm(total=self.total, desc=desc, dynamic_ncols=True)
                self._bar, self.kind = bar, k
                break
            except ImportError:
                continue

    def log(self, msg: str) -> None:
        if self.kind == "rich":
            self._bar.console.print(msg, markup=False, highlight=False)
        elif self.kind == "tqdm":
            self._bar.write(msg)
        else:
            print(msg, flush=True)

    def advance(self, label: str, n: int = 1) -> None:
        self.done += n
        if self.kind == "rich":
            self._bar.update(self._task, advance=n, description=label)
        elif self.kind == "tqdm":
            self._bar.set_description_str(label)
            self._bar.update(n)
        else:
            print(f"[{self.done}/{self.total} {time.perf_counter() - self._t0:6.1f} s] {label}", flush=True)

    def close(self) -> None:
        if self.kind == "rich":
            self._bar.stop()
        elif self.kind == "tqdm":
            self._bar.close()
