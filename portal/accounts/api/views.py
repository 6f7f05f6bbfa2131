from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.contrib.auth import authenticate, login, logout
from django.middleware.csrf import get_token
from django.utils.decorators import method_decorator
from django.views.decorators.csrf import ensure_csrf_cookie
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.accounts import webhooks
from portal.accounts.api.serializers import (
    ApiTokenSerializer,
    CreatedApiTokenSerializer,
    MeSerializer,
    WebhookSerializer,
)
from portal.accounts.models import ApiToken, Webhook
from portal.accounts.services import create_api_token, revoke_api_token
from portal.lib.throttling import WriteThrottle


class ApiTokenViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet
):
    """Your own API tokens. DELETE revokes a token (it stays listed as revoked)."""

    serializer_class = ApiTokenSerializer
    queryset = ApiToken.objects.none()  # for the schema; requests use get_queryset
    throttle_classes = [WriteThrottle]
    throttle_scope = "tokens"

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


class WebhookViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Your own webhooks: where the portal posts about your jobs (docs/api.md, *Webhooks*).
    PATCH changes what it names (an omitted secret stays); POST .../ID/test/ sends a test
    delivery at once and answers with the webhook and its outcome."""

    serializer_class = WebhookSerializer
    queryset = Webhook.objects.none()  # for the schema; requests use get_queryset
    throttle_classes = [WriteThrottle]
    throttle_scope = "webhooks"

    def get_queryset(self) -> Any:
        return Webhook.objects.filter(user=self.request.user)

    def perform_create(self, serializer: Any) -> None:
        try:
            serializer.instance = webhooks.create_webhook(self.request.user, **serializer.validated_data)
        except webhooks.WebhookLimitReached as exc:
            raise serializers.ValidationError({"non_field_errors": [str(exc)]}) from None

    def partial_update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        webhook = self.get_object()
        serializer = WebhookSerializer(webhook, data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        webhooks.update_webhook(webhook, request.user, **serializer.validated_data)
        return Response(WebhookSerializer(webhook).data)

    def perform_destroy(self, instance: Webhook) -> None:
        webhooks.delete_webhook(instance, self.request.user)

    @extend_schema(
        request=None,
        responses=WebhookSerializer,
        description="Sends a test delivery (event `webhook.test`) at once, enabled or not, never "
        "retried; answers with the webhook, its outcome in `last_delivery_*`.",
    )
    @action(detail=True, methods=["post"])
    def test(self, request: Request, pk: str | None = None) -> Response:
        webhook = self.get_object()
        webhooks.send_test(webhook, request.user, str(uuid.uuid4()))
        webhook.refresh_from_db()
        return Response(WebhookSerializer(webhook).data)


class MeView(APIView):
    """Who you are and your roles per tenant."""

    @extend_schema(responses=MeSerializer)
    def get(self, request: Request) -> Response:
        return Response(me_data(request.user))


def me_data(user: Any) -> dict[str, Any]:
    data = {
        "username": user.username,
        "is_staff": user.is_staff,
        "email": user.email,
        "mail_enabled": settings.MAIL_ENABLED,
        "memberships": user.memberships.select_related("tenant"),
    }
    return MeSerializer(data).data


class LoginSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    password = serializers.CharField(max_length=256, style={"input_type": "password"})


@method_decorator(ensure_csrf_cookie, name="get")
class SessionView(APIView):
    """Browser sign-in. GET sets the CSRF cookie and says who is signed in (if anyone);
    POST signs in with a user name and password; DELETE signs out."""

    permission_classes = [AllowAny]
    throttle_classes = [WriteThrottle]
    throttle_scope = "sign-in"

    @extend_schema(responses=MeSerializer)
    def get(self, request: Request) -> Response:
        get_token(request)
        if not request.user.is_authenticated:
            return Response({"detail": "Not signed in."}, status=status.HTTP_401_UNAUTHORIZED)
        return Response(me_data(request.user))

    @extend_schema(request=LoginSerializer, responses=MeSerializer)
    def post(self, request: Request) -> Response:
        form = LoginSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        user = authenticate(request._request, **form.validated_data)
        if user is None:
            # One message for a wrong name and a wrong password: names are not disclosed.
            return Response({"detail": "Wrong user name or password."}, status=status.HTTP_400_BAD_REQUEST)
        login(request._request, user)
        return Response(me_data(user))

    @extend_schema(request=None, responses={204: None})
    def delete(self, request: Request) -> Response:
        logout(request._request)
        return Response(status=status.HTTP_204_NO_CONTENT)
