"""trainstack's Pulumi program: `pulumi up` builds the cluster declared in infra/."""

from infra.program import main

main()
