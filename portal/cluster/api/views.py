from __future__ import annotations

from typing import Any

from rest_framework import viewsets

from portal.cluster.api.serializers import (
    FlavorSerializer,
    NodeSerializer,
    PriorityClassSerializer,
    VirtualClusterSerializer,
)
from portal.cluster.models import Flavor, Node, PriorityClass, VirtualCluster
from portal.cluster.services import gpus_in_use, latest_gpu_samples


class FlavorViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = Flavor.objects.all()
    serializer_class = FlavorSerializer
    filterset_fields = ["gpu_model"]


class PriorityClassViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = PriorityClass.objects.all()
    serializer_class = PriorityClassSerializer


class VirtualClusterViewSet(viewsets.ReadOnlyModelViewSet):
    """Virtual clusters of your tenants, with quotas and the GPUs in use now."""

    serializer_class = VirtualClusterSerializer
    lookup_field = "name"

    def get_queryset(self) -> Any:
        return (
            VirtualCluster.objects.for_user(self.request.user)
            .select_related("tenant")
            .prefetch_related("quotas")
        )

    def get_serializer_context(self) -> dict[str, Any]:
        context = super().get_serializer_context()
        context["usage"] = gpus_in_use(self.get_queryset())
        return context


class NodeViewSet(viewsets.ReadOnlyModelViewSet):
    """Nodes and their GPUs. Shows whether a GPU is allocated, never to whom."""

    serializer_class = NodeSerializer
    lookup_field = "name"
    filterset_fields = ["state", "rack"]

    def get_queryset(self) -> Any:
        return Node.objects.prefetch_related("gpus")

    def get_serializer_context(self) -> dict[str, Any]:
        from portal.jobs.models import Allocation

        context = super().get_serializer_context()
        context["allocated_gpu_ids"] = set(
            Allocation.objects.filter(released_at__isnull=True).values_list("gpu_id", flat=True)
        )
        context["latest_samples"] = latest_gpu_samples(Node.objects.values_list("id", flat=True))
        return context
