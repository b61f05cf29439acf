"""Cheaper migrations for the test databases (and the benches' throwaway databases the tests create).

django-fsm-2's FSMField connects a `class_prepared` receiver (`_collect_transitions`, no sender filter) every time
it is added to a model class. Migrations render historical models thousands of times (about 6,600 model classes
for the two test databases), so the receivers pile up and every later model class is announced to all of them:
quadratic, about a third of `migrate`'s time. A historical model (its `_meta.apps` is a migration state's
registry, not the project's) has no transition methods to collect, so its field's receiver is disconnected again
at once. The migrated schema is byte-identical (pg_dump compared, D-175); the project's own models are untouched.
"""
from __future__ import annotations

from django.apps import apps as project_apps
from django.db.models.signals import class_prepared
from django_fsm import FSMFieldMixin

_django_fsm_contribute_to_class = FSMFieldMixin.contribute_to_class


def _contribute_to_class(self, cls, name, private_only=False, **kwargs):
    _django_fsm_contribute_to_class(self, cls, name, private_only=private_only, **kwargs)
    if cls._meta.apps is not project_apps:  # a historical model rendered by a migration
        class_prepared.disconnect(self._collect_transitions)


def install() -> None:
    FSMFieldMixin.contribute_to_class = _contribute_to_class
