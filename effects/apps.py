from django.apps import AppConfig

from connector import hooks


class EffectsConfig(AppConfig):
    name = "effects"
    verbose_name = "Effects (outbound commands, remote effects, permits, delivery)"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # ready(): these modules read the models, which Django loads only after every apps.py (app loading)
        from connector.services import approvals
        from effects import selectors
        from effects.services import dispatch, identity, intents, runtime_bridge

        # halting_v2 -> v2_halted requires an empty open-permit set (the open permits referencing the gate); the set
        # form serves the whole-service halt (D-281).
        hooks.register_halt_blocker(dispatch.open_permit_reasons,
                                    of_gates=selectors.open_permit_reasons_of)
        # draining -> retired requires every RemoteEffect authored under the epoch terminal (D-267).
        hooks.register_retention_blocker(selectors.effect_retention_blockers)
        # Runtime authors outbound commands in its application transaction through this bridge.
        hooks.register_outbound_author(runtime_bridge.author_for_runtime)
        # A revocation lists the permits already sending under the generation (decision 4).
        hooks.register_revocation_evidence(dispatch.sending_permits_at_revocation)
        # Admission refuses a record key the outbound command could never store (decision D-165).
        hooks.register_admission_check(runtime_bridge.admission_problems)
        # Relinking an owner slot to another remote identity needs two approvers of exactly that change (D-191).
        approvals.register_subject(identity.APPROVAL_KIND, identity.relink_subject, identity.relink_outcome)
        # ... and a set of relinks one approval of the set, each member applied against its approved digest (D-494).
        approvals.register_set(identity.SET_KIND, identity.APPROVAL_KIND, identity.relink_set_outcome)
        # A replay preserves its predecessor's EffectRootIDs as correlation evidence and mints nothing (D-309).
        hooks.register_replay_admitted(intents.replay_correlate)
