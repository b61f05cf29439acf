"""Applies the current definition of every cutover function and trigger from `cutover/sql/` (D-510), on the
default database and on the journal."""
from django.db import migrations

from connector import sqlfiles


class Migration(migrations.Migration):
    dependencies = [("cutover", "0020_takeover_changes_only_the_holder"), ("connector", "0026_sql_files"),
                    ("effects", "0021_sql_files"), ("v1", "0004_sql_files")]

    operations = sqlfiles.operations("cutover")
