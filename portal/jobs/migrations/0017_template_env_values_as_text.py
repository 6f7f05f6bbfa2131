"""Environment values in saved job templates become text.

Until this release a template's `env` could hold numbers (YAML reads `8` or `4.40` as numbers),
which a submission turned into text (`"8"`, `"4.4"`). Submissions now refuse values that are not
text, so such a template could no longer be submitted as saved: each number is stored as the
text a submission made of it before, and the template submits as it did."""

from django.db import migrations


def numbers_as_text(apps, schema_editor):  # type: ignore[no-untyped-def]
    JobTemplate = apps.get_model("jobs", "JobTemplate")
    for template in JobTemplate.objects.iterator():
        env = template.spec.get("env") if isinstance(template.spec, dict) else None
        if not isinstance(env, dict):
            continue
        fixed = {
            name: str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value
            for name, value in env.items()
        }
        if fixed != env:
            template.spec = {**template.spec, "env": fixed}
            template.save(update_fields=["spec"])


class Migration(migrations.Migration):
    dependencies = [("jobs", "0016_allocation_released_at")]

    operations = [migrations.RunPython(numbers_as_text, migrations.RunPython.noop)]
