"""Pulumi components every target shares: the node image, the cluster secret, provisioning
and training. How the nodes come to exist is a target's (infra/targets)."""
