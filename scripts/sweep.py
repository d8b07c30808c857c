#!/usr/bin/env python
"""`python scripts/sweep.py ...`: the same as the installed command; the code is in `rnb.analysis.sweep_cli`."""
import sys

from rnb.analysis.sweep_cli import main

if __name__ == "__main__":
    sys.exit(main())
