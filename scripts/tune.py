#!/usr/bin/env python
"""`python scripts/tune.py ...`: the same as the installed command `rnb-tune`; the code is in `rnb.tune.cli`."""
import sys

from rnb.tune.cli import main

if __name__ == "__main__":
    sys.exit(main())
