#!/usr/bin/env python
"""`python scripts/analyze.py ...`: the same as the installed command; the code is in `rnb.analysis.analyze_cli`."""
import sys

from rnb.analysis.analyze_cli import main

if __name__ == "__main__":
    sys.exit(main())
