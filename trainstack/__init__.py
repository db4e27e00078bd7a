"""trainstack from Python: a stack's jobs and sweeps without the `trainstack` command.

    from trainstack import Client

    c = Client(stack="dev")          # None: the selected Pulumi stack
    job = c.submit("examples/digits", params={"dropout": 0.3}, epochs=5)
    print(c.wait(job)["state"])

`Client` and `TrainstackError` are infra.jobs.client's, imported on first use (importing this
package loads nothing else); the records its methods return are typed in infra.jobs.records
(`JobRecord`, `SweepRecord`, `Trial`: JSON objects, dicts at run time).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from infra.jobs.client import Client, TrainstackError
    from infra.jobs.records import JobRecord, SweepRecord, Trial

__all__ = ["Client", "JobRecord", "SweepRecord", "TrainstackError", "Trial"]
_RECORDS = ("JobRecord", "SweepRecord", "Trial")


def __getattr__(name: str) -> Any:
    if name in _RECORDS:
        from infra.jobs import records

        return getattr(records, name)
    if name in __all__:
        from infra.jobs import client

        return getattr(client, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
