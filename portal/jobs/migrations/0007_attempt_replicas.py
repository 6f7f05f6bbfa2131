from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("jobs", "0006_checkpoint_manifests_and_gc")]

    operations = [
        migrations.AddField(
            model_name="jobattempt",
            name="replicas",
            field=models.PositiveIntegerField(default=1),
        ),
        # Every attempt so far ran the job's own shape.
        migrations.RunSQL(
            "UPDATE jobs_jobattempt SET replicas = jobs_job.replicas FROM jobs_job "
            "WHERE jobs_jobattempt.job_id = jobs_job.id",
            reverse_sql=migrations.RunSQL.noop,
        ),
    ]
