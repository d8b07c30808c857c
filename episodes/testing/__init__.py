"""Test and bench tooling for the episodes package: never imported by the library itself.

- `synthetic`: LeRobot v3.0 datasets generated from a spec, every frame
  showing its dataset-wide index (RnB also writes its bundled default
  dataset with it);
- `server`: Debian's nginx serving a dataset directory on loopback, with
  fault locations, optionally behind `network`'s slower link;
- `network`: a loopback relay with a bandwidth and a round-trip time;
- `faults`: an HTTP server that misbehaves on purpose, request by request.

They live here rather than under tests/ because RnB's benchmarks (bench/)
serve and generate datasets with them too, and bench must not import the
test tree.
"""
