#!/usr/bin/env python
"""`python scripts/analyze.py ...`: the same as the installed command; the code is in `rnb.analysis.rnb_analyze`."""
import sys

from rnb.analysis.rnb_analyze import main

if __name__ == "__main__":
    sys.exit(main())
