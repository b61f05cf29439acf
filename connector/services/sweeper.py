"""The sweeper finds due work in PostgreSQL, so a lost broker message only delays it (Redis only wakes workers).

Today it re-attempts verification of `prepared` ServingEpochs (left prepared by retryable owner
unavailability). Later aggregates add their due-work queries here (expired leases, due retries)."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from connector.actors import Actor
from connector.errors import ConnectorError, OwnerUnavailable
from connector.selectors.serving import prepared_epoch_pks
from connector.services.serving import epoch_verify

log = logging.getLogger(__name__)
SWEEPER = Actor.system("sweeper")


@dataclass
class SweepReport:
    verified: list[int] = field(default_factory=list)
    rejected: list[int] = field(default_factory=list)
    deferred: list[int] = field(default_factory=list)


def serving_epoch_sweep(*, limit: int = 50) -> SweepReport:
    """Verify each prepared epoch once; unavailability defers it to the next sweep."""
    report = SweepReport()
    for pk in prepared_epoch_pks()[:limit]:
        try:
            epoch = epoch_verify(epoch_pk=pk, actor=SWEEPER)
        except OwnerUnavailable:
            report.deferred.append(pk)
            continue
        except ConnectorError as exc:  # moved meanwhile (FenceStale, TransitionRefused): nothing to do
            log.info("sweeper skipped epoch", extra={"epoch_pk": pk, "code": exc.code})
            continue
        (report.verified if epoch.state == "verified" else report.rejected).append(pk)
    if report.verified or report.rejected or report.deferred:
        log.info("serving epoch sweep", extra={"verified": report.verified, "rejected": report.rejected,
                                               "deferred": report.deferred})
    return report
