from django.conf import settings
from django.db import models


class BareJob(models.Model):
    """What a submission names (name, VC, flavor, command), stored with its owner and a state."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=100)
    vc = models.SlugField()
    flavor = models.SlugField()
    command = models.JSONField()
    state = models.CharField(max_length=16, default="pending")
    submitted_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name
