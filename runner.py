"""RnB's runner, now `rnb.harness.runner`: one process per (step, queue group, gpus entry)."""
from rnb.harness.runner import Runner, RunnerSpec, main

__all__ = ["Runner", "RunnerSpec", "main"]
