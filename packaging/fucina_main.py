"""The bundle's entry point: the `fucina` command (the app with no arguments)."""

import sys

from app.cli import main

if __name__ == "__main__":
    sys.exit(main())
