"""`python -m trainstack_training.queue RUN_DIR --lock FILE ... -- COMMAND`: a job's queue
process (process.py)."""

import sys

from trainstack_training.queue.process import main

sys.exit(main())
