from django.apps import AppConfig

from connector import hooks


class CutoverConfig(AppConfig):
    name = "cutover"
    verbose_name = "Cutover (V1 drain, certificates, restore points, activation)"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # ready(): these modules read the models, which Django loads only after every apps.py (app loading)
        from connector.services import approvals
        from cutover import selectors
        from cutover.services import approval_subjects, first_activation, v1_shutdown

        # v2_halted -> v2_serving on the predecessor is refused once any OrderingHandoff exists (CV2-11-020).
        hooks.register_resume_blocker(selectors.predecessor_resume_blockers)
        # draining -> retired waits for the barrier sets naming the epoch to be released (D-267).
        hooks.register_retention_blocker(selectors.barrier_set_retention_blockers)

        # While a service cutover is open only its coordinator moves the frozen gates along the V1 path.
        hooks.register_gate_action_guard(v1_shutdown.frozen_gate_blockers)

        # Owner publications and credential revocations ask the publication barrier sets first (CV2-12-064/065).
        hooks.register_publication_guard(first_activation.publication_guard)
        hooks.register_revocation_guard(first_activation.revocation_guard)

        for kind, resolver in approval_subjects.SUBJECTS.items():  # dual approval of cutover subjects
            approvals.register_subject(kind, resolver, approval_subjects.OUTCOMES.get(kind))
