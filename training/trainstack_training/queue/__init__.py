"""The queue: the node-side process of each job, a submitted job's and the stack's declared
job's alike (`python -m trainstack_training.queue RUN_DIR ...`, started on a worker node by
`trainstack submit` or by the declared job's provider). It keeps the job's record, waits for
the job's admission, runs the driver (`trainstack-train`), and records how it ended.

- process.py  the job's queue process: its states, its output, cancel
- admission.py  which queued jobs may start now: slots, order, priority
"""
