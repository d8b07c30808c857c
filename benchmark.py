"""RnB's entry point: `python benchmark.py -c config/x.json -mi 3 -v 2000` (installed: `rnb-benchmark`).

The process model lives in the package `rnb.harness`:
- `rnb/harness/job.py`: the main process: builds the queues and shared slots,
  spawns the client and one runner per (step, queue group, gpus entry),
  opens the start barrier, waits for the termination flag, writes the log;
- `rnb/harness/runner.py`: the runner loop every step runs;
- `rnb/harness/client.py`: the load generator;
- `rnb/harness/control.py`: what they share (flag, slots, queues);
- `rnb/harness/cli.py`: this command line (flags, exit codes).
Configuration and planning are in `rnb/pipeline/`, offline analysis in `rnb/analysis/`.
"""
import sys

if __name__ == "__main__":
    # Imported here, not above: every spawned child imports this file again (as __mp_main__) before
    # anything else, and must not import torch before it has tied its life to this process's
    # (rnb.harness.lifeline).
    from rnb.harness.cli import main

    sys.exit(main())
