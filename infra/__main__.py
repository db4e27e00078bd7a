"""trainstack's Pulumi program: `pulumi up` builds the cluster declared in infra/."""

from infra.errors import quiet_cancellation
from infra.program import main

quiet_cancellation()
main()
