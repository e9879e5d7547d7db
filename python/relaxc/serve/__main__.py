"""python -m relaxc.serve MODEL.so: the command line (relaxc.serve.cli)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
