"""How nodes come to exist, one module per target (docs/targets.md).

`docker` (containers on the local engine) and `ssh` (servers you have) each declare one
cluster component that gives the program `base.ClusterOutputs`; `aws` declares instances on
paper (tested under Pulumi's mocks only) whose outputs are the ssh target's server list.
"""
