"""trainstack's control side: the Pulumi program, its components and the provisioning."""
