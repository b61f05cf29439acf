"""Applies the current definition of every connector function and trigger from `connector/sql/` (D-510): the
earlier migrations are history, these files are what the database holds (connector/sqlfiles.py)."""
from django.db import migrations

from connector import sqlfiles


class Migration(migrations.Migration):
    dependencies = [("connector", "0025_dual_approval_reason_refusal")]

    operations = sqlfiles.operations("connector")
