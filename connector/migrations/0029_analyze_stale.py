"""The statistics sweep's function becomes `connector_analyze_stale` (D-544): it also analyzes a table whose
statistics were taken when it was much smaller. Applied with the app's other SQL files; the old name is dropped."""
from django.db import migrations

from connector import sqlfiles


class Migration(migrations.Migration):
    dependencies = [("connector", "0028_dual_approval_sets")]

    operations = [
        *sqlfiles.operations("connector"),
        migrations.RunSQL("DROP FUNCTION IF EXISTS connector_analyze_unanalyzed(bigint)", migrations.RunSQL.noop),
    ]
