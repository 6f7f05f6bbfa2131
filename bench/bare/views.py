from __future__ import annotations

from typing import Any

from rest_framework import generics, serializers

from bench.bare.models import BareJob


class BareJobSerializer(serializers.ModelSerializer):
    class Meta:
        model = BareJob
        fields = ["id", "name", "vc", "flavor", "command", "state", "submitted_at"]
        read_only_fields = ["state", "submitted_at"]


class BareJobCreate(generics.CreateAPIView):
    serializer_class = BareJobSerializer

    def perform_create(self, serializer: Any) -> None:
        serializer.save(owner=self.request.user)
