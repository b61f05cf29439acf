"""Governance owns no facts: every fact it shows and every decision it takes belongs to connector, effects or
cutover and goes through their services. This unmanaged model only carries the screens' own permissions."""
from django.db import models


class GovernanceScreens(models.Model):
    class Meta:
        managed = False
        default_permissions = ()
        permissions = [("view_governance", "Can open the operator governance screens"),
                       ("release_held_item", "Can release items held by a step failure once the fix is deployed")]
