"""The hyperparameter sweep (issue 50): many trials of one job, each a run with its own params,
searched by Optuna. space.py reads and checks the sweep's definition (the job manifest's
[sweep] table, or a separate file's) on the control machine and in the sweep's driver on the
cluster, and turns it into Optuna's search space, sampler and pruner.
"""
