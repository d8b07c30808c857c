"""rnb-tune: RnB finds the configuration (replicas, batch sizes, placement) that serves the most under a latency bound.

One module per phase, each usable alone:

    space     the tuning config, the budget, a candidate
    profile   each step alone through the harness, per input form (cached in DIR/profiles/)
    estimate  a discrete-event simulation of any candidate
    search    exhaustive, quick (bottleneck-relieving) or Optuna, with constraints
    verify    the finalists run for real through the sweep
    report    best.json, candidates.parquet, the Pareto plot, report.html
    cli       the rnb-tune command

Imports run one way: tune -> harness (through the sweep's benchmark runs), analysis, pipeline.
"""
