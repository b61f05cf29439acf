"""The readiness certificate freezes the V2 schema and binary digests verified offline before maintenance (issue 22,
CV2-12-019). A certificate written before this migration carries 32 zero bytes, which no digest equals: its
attempt cannot enter maintenance (open a new attempt)."""
from django.db import migrations, models
from django.db.models.functions import Length
from django.db.models.lookups import Exact

ZERO = b"\0" * 32


class Migration(migrations.Migration):
    dependencies = [("cutover", "0016_activation_inventory")]

    operations = [
        migrations.AddField("cutoverreadinesscertificate", "v2_schema_digest",
                            models.BinaryField(max_length=32, default=ZERO), preserve_default=False),
        migrations.AddField("cutoverreadinesscertificate", "v2_binary_digest",
                            models.BinaryField(max_length=32, default=ZERO), preserve_default=False),
        migrations.AddConstraint("cutoverreadinesscertificate", models.CheckConstraint(
            condition=Exact(Length("v2_schema_digest"), 32), name="cutover_readiness_v2_schema_digest_length")),
        migrations.AddConstraint("cutoverreadinesscertificate", models.CheckConstraint(
            condition=Exact(Length("v2_binary_digest"), 32), name="cutover_readiness_v2_binary_digest_length")),
    ]
