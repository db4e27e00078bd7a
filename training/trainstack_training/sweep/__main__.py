"""`python -m trainstack_training.sweep SWEEP_DIR`: a sweep's driver (driver.py)."""

import sys

from trainstack_training.sweep.driver import main

sys.exit(main(sys.argv[1:]))
