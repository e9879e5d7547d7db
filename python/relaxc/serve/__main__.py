"""python -m relaxc.serve MODEL.so: the command line (relaxc.serve.cli)."""

import sys

from .. import MissingExtra, require_extra

if __name__ == "__main__":
    # relaxc.serve.cli imports Ray: check for it first, so a missing extra is a one-line error.
    try:
        require_extra("serve", "python -m relaxc.serve", ["ray", "tvm_ffi"])
    except MissingExtra as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    from .cli import main

    sys.exit(main())
