"""ExecutionDependency resolution: `waiting -> satisfied | expired | rejected`, with an immutable deadline and
no worker lease while waiting. A satisfy/expire race has one result: both lock the Execution, then the
dependency, and re-check its state (CV2-07)."""
from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from connector import locks
from connector.actors import Actor
from connector.services.audit import audit_record
from connector.choices import DependencyState, ExecutionState
from connector.models import Execution, ExecutionDependency
from connector.services.guard import lock_serving


def requirement_met(*, account_id: int, requirement_key: str) -> bool:
    """A prerequisite is met when an Execution of the live Event with that SourceEventKey completed."""
    return Execution.objects.filter(account_id=account_id, state=ExecutionState.COMPLETED,
                                    projection__event__source_event_key=requirement_key,
                                    projection__event__replay_request__isnull=True).exists()


def dependency_resolve(*, dependency_pk: int, reject_evidence: str = "") -> str:
    """Resolve one waiting dependency: satisfied if its requirement is met, expired once its deadline passed,
    rejected on explicit evidence; the Execution becomes ready when all its dependencies are satisfied, and is
    quarantined (DEPENDENCY_EXPIRED / DEPENDENCY_REJECTED) otherwise. Returns the dependency's state."""
    dependency = (ExecutionDependency.objects.select_related("execution__epoch")
                  .defer("execution__epoch__preimage").get(pk=dependency_pk))
    execution = dependency.execution
    with transaction.atomic():
        lock_serving(account_id=execution.account_id, epoch_id=execution.epoch.epoch_id,
                     epoch_digest=bytes(execution.epoch.digest), settling=True)
        execution = locks.execution_for_update(execution.pk)
        dependency = locks.dependency_for_update(dependency_pk)
        if dependency.state != DependencyState.WAITING:
            return dependency.state
        now = timezone.now()
        if reject_evidence:
            dependency.reject(at=now, evidence=reject_evidence)
        elif requirement_met(account_id=execution.account_id, requirement_key=dependency.requirement_key):
            dependency.satisfy(at=now, evidence=f"completed:{dependency.requirement_key}")
        elif now >= dependency.deadline:
            dependency.expire(at=now)
        else:
            return dependency.state
        dependency.save()
        audit_record(actor=Actor.system("sweeper"), entity=dependency, action="dependency_resolve",
                     from_state=DependencyState.WAITING, to_state=dependency.state, reason=dependency.evidence)
        if execution.state == ExecutionState.WAITING_DEPENDENCY:
            if dependency.state in (DependencyState.EXPIRED, DependencyState.REJECTED):
                execution.quarantine(reason=f"DEPENDENCY_{dependency.state.upper()}")
                execution.save()
            elif not execution.dependencies.exclude(state=DependencyState.SATISFIED).exists():
                execution.dependency_ready()
                execution.save()
        return dependency.state


def waiting_dependencies(limit: int = 200) -> list[tuple[int, int]]:
    """(dependency, execution) of the waiting dependencies, soonest deadline first (the sweeper's due work)."""
    return list(ExecutionDependency.objects.filter(state=DependencyState.WAITING).order_by("deadline")
                .values_list("pk", "execution_id")[:limit])
