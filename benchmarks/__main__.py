"""``python -m benchmarks``: the whole peer benchmark suite (see benchmarks/run_all.py)."""
import sys

from benchmarks.run_all import main

sys.exit(main())
