"""Test support shared by the tests and the benchmarks under bench/: stacks of this project
driven with the real Pulumi CLI (stacks), sshd servers in containers (sshd), the Docker-API
test cluster of the images test and bench_provisioning, with the program's inventory (cluster),
HA failover measurement (failover) and the removal of what killed runs left on the engine
(leftovers). No test lives here."""
