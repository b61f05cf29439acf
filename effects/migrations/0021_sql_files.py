"""Applies the current definition of every effects function and trigger from `effects/sql/` (D-510)."""
from django.db import migrations

from connector import sqlfiles


class Migration(migrations.Migration):
    dependencies = [("effects", "0020_certification_refusal"), ("connector", "0026_sql_files")]

    operations = sqlfiles.operations("effects")
