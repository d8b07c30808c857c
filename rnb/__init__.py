"""RnB, the benchmark harness, in packages whose imports run one way (ARCHITECTURE.md).

- `rnb.pipeline`: a config file becomes a validated, planned pipeline
  (config, sources, GPU checks, runner placements), before anything starts.
- `rnb.core`: what every engine and the analysis share: messages, time
  cards, termination, the stage vocabulary, the job log's files and records.
- `rnb.engines`: the runner loop and load generator every engine runs, and
  the engines themselves (`local`: spawned processes on one host; `ray`:
  actors on a Ray cluster).
- `rnb.analysis`: what is read back from job logs afterwards (tables,
  reports, plots, load sweeps).
- `rnb.cli`: the benchmark command over all of them.

RnB's `benchmark.py` and `selector.py` stay at the top where its users
expect them; the models are in `models/` and the episode data path, a
library of its own, in `episodes/`.
"""
