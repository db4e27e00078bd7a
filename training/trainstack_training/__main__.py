"""`python -m trainstack_training` is the same as `trainstack-train`."""

import sys

from trainstack_training.cli import main

if __name__ == "__main__":
    sys.exit(main())
