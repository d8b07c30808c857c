"""RnB's runner, now `rnb.harness.runner`: the loop of one process per (step, queue group, gpus entry)."""
from rnb.harness.runner import Runner, RunnerSpec

__all__ = ["Runner", "RunnerSpec"]
