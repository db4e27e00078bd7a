"""How nodes come to exist, one module per target (docs/targets.md).

The docker target is `infra.components.Cluster`; `aws` declares instances on paper (tested
under Pulumi's mocks only) whose outputs are the ssh target's server list.
"""
