"""Issue 8: drop the single-column foreign-key indexes that a composite index already
starts with (every write inserted into them; nothing needs them). The history pages also
read better without one: PostgreSQL chose ``checkpointrevision (checkpoint_id)`` and
filtered 2,000 revisions instead of the range of ``(checkpoint_id, revision)``.

Only the indexes go (the foreign-key constraints stay, not re-validated): the field state
changes to ``db_index=False`` and the database just drops the index Django named, on
PostgreSQL and SQLite alike; going back creates it again.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('checkpoints', '0009_list_indexes'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL('DROP INDEX IF EXISTS "checkpoints_auditevent_tenant_id_73ea2cc6"',
                                  'CREATE INDEX "checkpoints_auditevent_tenant_id_73ea2cc6" ON "checkpoints_auditevent" ("tenant_id")'),
                migrations.RunSQL('DROP INDEX IF EXISTS "checkpoints_checkpoint_tenant_id_81681d2b"',
                                  'CREATE INDEX "checkpoints_checkpoint_tenant_id_81681d2b" ON "checkpoints_checkpoint" ("tenant_id")'),
                migrations.RunSQL('DROP INDEX IF EXISTS "checkpoints_checkpointrevision_checkpoint_id_664cbf03"',
                                  'CREATE INDEX "checkpoints_checkpointrevision_checkpoint_id_664cbf03" ON "checkpoints_checkpointrevision" ("checkpoint_id")'),
                migrations.RunSQL('DROP INDEX IF EXISTS "checkpoints_conflict_run_id_908e83c1"',
                                  'CREATE INDEX "checkpoints_conflict_run_id_908e83c1" ON "checkpoints_conflict" ("run_id")'),
                migrations.RunSQL('DROP INDEX IF EXISTS "checkpoints_effect_run_id_06fdbe03"',
                                  'CREATE INDEX "checkpoints_effect_run_id_06fdbe03" ON "checkpoints_effect" ("run_id")'),
                migrations.RunSQL('DROP INDEX IF EXISTS "checkpoints_effect_tenant_id_ac584027"',
                                  'CREATE INDEX "checkpoints_effect_tenant_id_ac584027" ON "checkpoints_effect" ("tenant_id")'),
                migrations.RunSQL('DROP INDEX IF EXISTS "checkpoints_effectrevision_effect_id_cab448b4"',
                                  'CREATE INDEX "checkpoints_effectrevision_effect_id_cab448b4" ON "checkpoints_effectrevision" ("effect_id")'),
                migrations.RunSQL('DROP INDEX IF EXISTS "checkpoints_retryrequest_tenant_id_5213523c"',
                                  'CREATE INDEX "checkpoints_retryrequest_tenant_id_5213523c" ON "checkpoints_retryrequest" ("tenant_id")'),
                migrations.RunSQL('DROP INDEX IF EXISTS "checkpoints_run_tenant_id_053b3af6"',
                                  'CREATE INDEX "checkpoints_run_tenant_id_053b3af6" ON "checkpoints_run" ("tenant_id")'),
            ],
            state_operations=[
                migrations.AlterField(
                    model_name='auditevent',
                    name='tenant',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='checkpoints.tenant'),
                ),
                migrations.AlterField(
                    model_name='checkpoint',
                    name='tenant',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='checkpoints.tenant'),
                ),
                migrations.AlterField(
                    model_name='checkpointrevision',
                    name='checkpoint',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='revisions', to='checkpoints.checkpoint'),
                ),
                migrations.AlterField(
                    model_name='conflict',
                    name='run',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='conflicts', to='checkpoints.run'),
                ),
                migrations.AlterField(
                    model_name='effect',
                    name='run',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='effects', to='checkpoints.run'),
                ),
                migrations.AlterField(
                    model_name='effect',
                    name='tenant',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='checkpoints.tenant'),
                ),
                migrations.AlterField(
                    model_name='effectrevision',
                    name='effect',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='revisions', to='checkpoints.effect'),
                ),
                migrations.AlterField(
                    model_name='retryrequest',
                    name='tenant',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='checkpoints.tenant'),
                ),
                migrations.AlterField(
                    model_name='run',
                    name='tenant',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='runs', to='checkpoints.tenant'),
                ),
            ],
        ),
    ]
