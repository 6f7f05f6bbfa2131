from django.db import models


class Role(models.TextChoices):
    """A member's role in a tenant. Admins manage the tenant's jobs; viewers only read."""

    ADMIN = "admin", "Tenant admin"
    MEMBER = "member", "Member"
    VIEWER = "viewer", "Viewer"


SUBMIT_ROLES = frozenset({Role.ADMIN, Role.MEMBER})


class WebhookFormat(models.TextChoices):
    """The body a webhook receives: chat tools take `{"text": ...}`; other receivers the JSON event."""

    SLACK = "slack", 'Slack / Mattermost ({"text": ...})'
    JSON = "json", "JSON event"
