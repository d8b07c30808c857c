#!/usr/bin/env python
"""`python scripts/sweep.py ...`: the same as the installed command; the code is in `rnb.analysis.rnb_sweep`."""
import sys

from rnb.analysis.rnb_sweep import main

if __name__ == "__main__":
    sys.exit(main())
