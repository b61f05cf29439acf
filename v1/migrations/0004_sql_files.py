"""Applies the current definition of every V1 function and trigger from `v1/sql/` (D-510)."""
from django.db import migrations

from connector import sqlfiles


class Migration(migrations.Migration):
    dependencies = [("v1", "0003_workitem_dependency_deadline"), ("connector", "0026_sql_files")]

    operations = sqlfiles.operations("v1")
