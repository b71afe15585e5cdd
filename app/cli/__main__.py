"""`python -m app.cli`: the `fucina` command."""

import sys

from app.cli import main

if __name__ == "__main__":  # not in a child process that multiprocessing starts by importing this module
    sys.exit(main())
