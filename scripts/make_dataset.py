#!/usr/bin/env python
"""`python scripts/make_dataset.py ...`: the same as the installed command; the code is in `rnb.make_dataset`."""
import sys

from rnb.make_dataset import main

if __name__ == "__main__":
    sys.exit(main())
