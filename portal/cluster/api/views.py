from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import permissions, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from portal.cluster import budgets
from portal.cluster.api.serializers import (
    FlavorSerializer,
    NodeActionSerializer,
    NodeSerializer,
    PriorityClassSerializer,
    VirtualClusterSerializer,
)
from portal.cluster.models import Flavor, Node, PriorityClass, VirtualCluster
from portal.cluster.services import gpus_in_use, latest_gpu_samples, set_node_state
from portal.jobs.models import Allocation, Job
from portal.lib.lookup import NamedNotFound


class FlavorViewSet(NamedNotFound, viewsets.ReadOnlyModelViewSet):
    queryset = Flavor.objects.all()
    serializer_class = FlavorSerializer
    filterset_fields = ["gpu_model"]


class PriorityClassViewSet(NamedNotFound, viewsets.ReadOnlyModelViewSet):
    queryset = PriorityClass.objects.all()
    serializer_class = PriorityClassSerializer


class VirtualClusterViewSet(NamedNotFound, viewsets.ReadOnlyModelViewSet):
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
        vcs = self.get_queryset()
        if self.lookup_field in self.kwargs:  # one VC: count for it alone
            vcs = vcs.filter(name=self.kwargs[self.lookup_field])
        context["usage"] = gpus_in_use(vcs)
        context["budget_hours"] = budgets.gpu_hours_this_month(vcs, timezone.now())
        return context


class NodeViewSet(NamedNotFound, viewsets.ReadOnlyModelViewSet):
    """Nodes and their GPUs. Shows whether a GPU is allocated, and to which job only when the job
    is one of your tenants'. Cluster admins cordon, drain and uncordon nodes."""

    serializer_class = NodeSerializer
    lookup_field = "name"
    filterset_fields = ["state", "rack"]

    def get_queryset(self) -> Any:
        return Node.objects.prefetch_related("gpus")

    def get_serializer_context(self) -> dict[str, Any]:
        context = super().get_serializer_context()
        live = Allocation.objects.holding()
        context["allocated_gpu_ids"] = set(live.values_list("gpu_id", flat=True))
        visible = Job.objects.for_user(self.request.user).values("pk")
        context["visible_jobs"] = dict(
            live.filter(attempt__job__in=visible).values_list("gpu_id", "attempt__job_id")
        )
        context["latest_samples"] = latest_gpu_samples(Node.objects.values_list("id", flat=True))
        return context

    @extend_schema(request=NodeActionSerializer, responses=NodeSerializer)
    @action(detail=True, methods=["post"], permission_classes=[permissions.IsAdminUser])
    def state(self, request: Request, name: str | None = None) -> Response:
        """Cordon (no new work), drain (no new work, jobs move away) or uncordon the node."""
        node = self.get_object()
        given = NodeActionSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        set_node_state(node, given.validated_data["action"], request.user, given.validated_data["reason"])
        return Response(self.get_serializer(self.get_queryset().get(pk=node.pk)).data)
