"""RnB's entry point: `python benchmark.py -c config/x.json -mi 3 -v 2000` (installed: `rnb-benchmark`).

Who spawns whom and what flows where is in one driver module per engine:
- `rnb/engines/local/driver.py`: the main process on one host: builds the
  queues and shared slots, spawns the client and one runner per (step, queue
  group, gpus entry), opens the start barrier, waits for the termination
  flag, writes the log;
- `rnb/engines/ray/driver.py`: the same job as Ray actors on a cluster;
- `rnb/engines/runner.py`: the runner loop every step runs, on either engine;
- `rnb/engines/client.py`: the load generator;
- `rnb/cli.py`: this command line (flags, exit codes, the end-of-run summary).
ARCHITECTURE.md draws the whole picture.
"""
import signal
import sys

if __name__ == "__main__":
    # Ctrl-C and SIGTERM wait (pending) until the command's handlers are set, as rnb.launch's first act
    # (rnb.engines.stopping): from this line on a stop ends the command tidily, with exit 130 or 143.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    # Imported here, not above: every spawned child imports this file again (as __mp_main__) before
    # anything else, and must not import torch before it has tied its life to this process's
    # (rnb.engines.local.lifeline).  rnb.launch starts the fork server before the command imports torch.
    from rnb.launch import main

    sys.exit(main())
