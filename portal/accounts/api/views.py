from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, viewsets
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.accounts.api.serializers import ApiTokenSerializer, CreatedApiTokenSerializer, MeSerializer
from portal.accounts.models import ApiToken
from portal.accounts.services import create_api_token, revoke_api_token


class ApiTokenViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet
):
    """Your own API tokens. DELETE revokes a token (it stays listed as revoked)."""

    serializer_class = ApiTokenSerializer
    queryset = ApiToken.objects.none()  # for the schema; requests use get_queryset

    def get_queryset(self) -> Any:
        return ApiToken.objects.filter(user=self.request.user)

    @extend_schema(request=ApiTokenSerializer, responses={201: CreatedApiTokenSerializer})
    def create(self, request: Request) -> Response:
        serializer = ApiTokenSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        token, raw = create_api_token(
            request.user, serializer.validated_data["name"], serializer.validated_data.get("expires_in_days")
        )
        token.token = raw  # type: ignore[attr-defined]
        return Response(CreatedApiTokenSerializer(token).data, status=201)

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        token = revoke_api_token(self.get_object(), request.user)
        return Response(ApiTokenSerializer(token).data)


class MeView(APIView):
    """Who you are and your roles per tenant."""

    @extend_schema(responses=MeSerializer)
    def get(self, request: Request) -> Response:
        user = request.user
        data = {
            "username": user.username,
            "is_staff": user.is_staff,
            "memberships": user.memberships.select_related("tenant"),
        }
        return Response(MeSerializer(data).data)
