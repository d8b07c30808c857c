"""MLPerf LoadGen as a job's client (`--client loadgen`): LoadGen issues, the pipeline serves, the final step completes.

    client process: LoadGen ──issue callback: Request per sample──▶ step 0 ... final step
                    LoadGen ◀──QuerySamplesComplete── completer thread ◀──item ids── final step's hand-over

LoadGen's own scenario code decides what is issued when (Server's Poisson
schedule, SingleStream's and MultiStream's lockstep, Offline's one query),
from the job's flags (settings.py).  An engine gives the client a way to
submit requests (its ClientTransport) and a channel of finished item ids
from the final step (`Completions`); the local engine's is a ring
(rnb.engines.local.plumbing).  LoadGen's summary and detail logs land in
the job's directory.  The package is optional: `pip install '.[loadgen]'`.
"""
from rnb.engines.loadgen.client import Completions, drive
from rnb.engines.loadgen.settings import loadgen_refusal

__all__ = ["Completions", "drive", "loadgen_refusal"]
