from django.apps import AppConfig


class ShellConfig(AppConfig):
    name = "portal.shell"
    label = "shell"
    verbose_name = "Shells in running jobs"
