"""The statistics sweep's function, `connector_analyze_unanalyzed` (D-542), applied with the app's other SQL files."""
from django.db import migrations

from connector import sqlfiles


class Migration(migrations.Migration):
    dependencies = [("connector", "0026_sql_files")]

    operations = sqlfiles.operations("connector")
