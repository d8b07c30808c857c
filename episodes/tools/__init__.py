"""Checks and measurements of the library: what `python -m episodes` runs, and what RnB's benchmarks use.

- `verify`: every episode's frames, byte-range path against a full-file
  decode, compared bit for bit (`python -m episodes verify`);
- `streaming`: LeRobot's episode-streaming benchmark tracks side by side
  (`python -m episodes bench`);
- `spans`: an episode's own, tight and widened bytes in its file.

The library never imports them; only the command line (episodes.__main__),
RnB's benchmarks and the tests do.
"""
