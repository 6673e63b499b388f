"""``python -m ripples``: the ``ripples`` command (``ripples info``, ``ripples sim``)."""
import sys

from ripples.runner.info import main

if __name__ == "__main__":
    sys.exit(main())
