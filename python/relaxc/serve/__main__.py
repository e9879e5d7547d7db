"""python -m relaxc.serve MODEL.so: the command line (relaxc.serve.cli)."""

import sys

from .. import exit_without_extra

if __name__ == "__main__":
    # relaxc.serve.cli imports Ray: check for it first, so a missing extra is a one-line error.
    exit_without_extra("serve", "python -m relaxc.serve", ["ray", "tvm_ffi"])
    from .cli import main

    sys.exit(main())
