"""RnB, the benchmark harness, in three packages by lifecycle.

- `rnb.pipeline`: a config file becomes a validated, planned pipeline
  (config, sources, GPU checks, runner placements), before anything starts.
- `rnb.harness`: the process model that runs it (main process, client,
  runners, their shared plumbing, time cards, the job log).
- `rnb.analysis`: what is read back from job logs afterwards (tables,
  reports, plots, load sweeps).

The top-level `benchmark.py`, `client.py`, `runner.py` and `control.py` keep
RnB's entry points where its users expect them; the models are in `models/`
and the episode data path in `episodes/`.
"""
