from django.apps import AppConfig


class ClusterConfig(AppConfig):
    name = "portal.cluster"
    label = "cluster"
    verbose_name = "Cluster"
