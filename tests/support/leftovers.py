"""Remove what an interrupted test run left on the Docker engine.

A test stack's state lives in the run's pytest temp directory, so a run that is killed
(a lost session, a CI timeout) leaves its containers, networks and volumes behind with
nothing to destroy them. Their containers restart with the engine and hold the node image,
which the next run's newcomer test must remove to bake it afresh; so does the ssh module's
server image built on the node image (tests/support/sshd.py), which is removed too.

Only test objects are touched: the test-only labels, and Pulumi stacks whose label is a
test stack's (`ts<module>-t<6 hex>`, see `tests/support/stacks.Stack`, and the newcomer test's
`trainstack-newcomer-<6 hex>`). The README's dev stack (`trainstack-dev`) and any stack a user
names otherwise are left alone.

    python -m tests.support.leftovers         # what `.ci/run` does before the tests
"""

from __future__ import annotations

import re
import sys

import docker

from tests.support.cluster import LABEL as LABEL_CLUSTER
from tests.support.sshd import LABEL as LABEL_SSHD
from tests.support.sshd import remove_node_images
from tests.support.stacks import LABEL_STACK, remove_engine_objects

TEST_STACK = re.compile(r"^(ts[a-z]+-t|trainstack-newcomer-)[0-9a-f]{6}$")


def is_test_object(labels: dict[str, str] | None) -> bool:
    """Whether an engine object's labels are a test's."""
    labels = labels or {}
    if LABEL_CLUSTER in labels or LABEL_SSHD in labels:
        return True
    return bool(TEST_STACK.match(labels.get(LABEL_STACK, "")))


def main() -> int:
    try:
        docker.from_env().ping()
    except Exception as exc:
        print(f"leftovers: the Docker engine does not answer ({exc}); run `make setup` first")
        return 1
    removed = remove_engine_objects({}, is_test_object)
    # After the containers that used them: an sshd image on a stale node image would keep
    # `make clean-images` from removing that node image.
    removed += [f"image {tag}" for tag in remove_node_images(docker.from_env())]
    for item in removed:
        print(f"leftovers: removed {item}")
    print(f"leftovers: {len(removed)} test object(s) from interrupted runs removed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
