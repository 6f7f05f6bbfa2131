from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.conf import settings
from django.contrib.auth import authenticate, login, logout
from django.middleware.csrf import get_token
from django.utils.decorators import method_decorator
from django.views.decorators.csrf import ensure_csrf_cookie
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.authentication import SessionAuthentication
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, PermissionDenied
from rest_framework.permissions import SAFE_METHODS, AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.accounts import oidc, services, webhooks
from portal.accounts.api.serializers import (
    AddMemberSerializer,
    ApiTokenSerializer,
    CreatedApiTokenSerializer,
    MemberRoleSerializer,
    MemberSerializer,
    MeSerializer,
    TenantSerializer,
    WebhookSerializer,
)
from portal.accounts.choices import Role
from portal.accounts.models import ApiToken, Membership, Webhook
from portal.accounts.services import create_api_token, revoke_api_token
from portal.lib.lookup import NamedNotFound
from portal.lib.throttling import WriteThrottle


class ApiTokenViewSet(
    NamedNotFound,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Your own API tokens. DELETE revokes a token (it stays listed as revoked)."""

    serializer_class = ApiTokenSerializer
    noun = "API token"
    queryset = ApiToken.objects.none()  # for the schema; requests use get_queryset
    throttle_classes = [WriteThrottle]
    throttle_scope = "tokens"

    def get_queryset(self) -> Any:
        return ApiToken.objects.filter(user=self.request.user)

    @extend_schema(
        request=ApiTokenSerializer,
        responses={201: CreatedApiTokenSerializer},
        description="Only from a signed-in session (the web app, `gpuportal login`): a request "
        "authenticated by an API token is refused with 403.",
    )
    def create(self, request: Request) -> Response:
        # A token may not mint tokens: whoever holds a leaked one (or a short-lived CI one) could
        # otherwise make a never-expiring token that outlives its expiry and its revocation.
        if isinstance(request.auth, ApiToken):
            raise PermissionDenied(
                "An API token cannot create tokens. Create one from a signed-in browser session "
                "(the web app's Tokens page) or with `gpuportal login`."
            )
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
    NamedNotFound,
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


class TenantViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """The tenants you belong to, with your role in each. Cluster admins too see only their own
    memberships here: they manage every tenant in Django admin."""

    serializer_class = TenantSerializer
    queryset = Membership.objects.none()  # for the schema; requests use get_queryset

    def get_queryset(self) -> Any:
        return (
            Membership.objects.filter(user=self.request.user)
            .select_related("tenant")
            .order_by("tenant__name")
        )


@contextmanager
def member_refusals_as_api_errors() -> Iterator[None]:
    try:
        yield
    except services.MemberRefused as exc:
        raise serializers.ValidationError({exc.field or "non_field_errors": [exc.message]}) from exc
    except services.MemberDenied as exc:
        raise PermissionDenied(str(exc)) from exc
    except services.NoSuchMember as exc:
        raise NotFound(str(exc)) from exc


class TenantMemberViewSet(viewsets.GenericViewSet):
    """The members of one of your tenants. Any member may list them; its admins add members,
    change roles and remove members. A tenant you do not belong to answers 404 like one that does
    not exist, to cluster admins too."""

    serializer_class = MemberSerializer
    queryset = Membership.objects.none()  # for the schema; requests use get_queryset
    throttle_classes = [WriteThrottle]
    throttle_scope = "members"
    own: Membership  # the requester's membership of the tenant in the URL, set by initial

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        # After authentication and throttling; before the body is read, so that a viewer hears
        # 403 (and an outsider 404) whatever they sent.
        super().initial(request, *args, **kwargs)
        own = (
            Membership.objects.filter(tenant__name=kwargs["tenant"], user=request.user)
            .select_related("tenant")
            .first()
        )
        if own is None:
            raise NotFound("No such tenant among yours.")
        self.own = own
        if request.method not in SAFE_METHODS and own.role != Role.ADMIN:
            raise PermissionDenied(f"Only an admin of tenant {own.tenant.name} may change its members.")

    def get_queryset(self) -> Any:
        return (
            Membership.objects.filter(tenant=self.own.tenant)
            .select_related("user")
            .order_by("user__username")
        )

    @extend_schema(description="The tenant's members by user name, for any of them.")
    def list(self, request: Request, tenant: str) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(self.get_serializer(page, many=True).data)

    @extend_schema(
        request=AddMemberSerializer,
        responses={201: MemberSerializer},
        description="Tenant admins: add an existing, active user account to the tenant with a role.",
    )
    def create(self, request: Request, tenant: str) -> Response:
        body = AddMemberSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        with member_refusals_as_api_errors():
            membership = services.add_member(self.own.tenant, request.user, **body.validated_data)
        return Response(self.get_serializer(membership).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        request=MemberRoleSerializer,
        responses=MemberSerializer,
        description="Tenant admins: change a member's `role` (required). The tenant keeps at "
        "least one admin: demoting the last one is a 400 on `role`.",
    )
    def partial_update(self, request: Request, tenant: str, username: str) -> Response:
        body = MemberRoleSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        with member_refusals_as_api_errors():
            membership = services.change_member_role(
                self.own.tenant, request.user, username, body.validated_data["role"]
            )
        return Response(self.get_serializer(membership).data)

    @extend_schema(
        request=None,
        responses={204: None},
        description="Tenant admins: remove a member; their jobs stay with the tenant. Removing "
        "the last admin is a 400.",
    )
    def destroy(self, request: Request, tenant: str, username: str) -> Response:
        with member_refusals_as_api_errors():
            services.remove_member(self.own.tenant, request.user, username)
        return Response(status=status.HTTP_204_NO_CONTENT)


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


class SsoSerializer(serializers.Serializer):
    enabled = serializers.BooleanField()
    name = serializers.CharField(help_text="What the sign-in page calls the provider.")
    login_url = serializers.CharField(help_text="Open it in the browser, with `?next=PATH` to land there.")


class SsoView(APIView):
    """Whether the portal signs people in through an OpenID Connect provider, for the sign-in page."""

    permission_classes = [AllowAny]

    @extend_schema(responses=SsoSerializer)
    def get(self, request: Request) -> Response:
        enabled = oidc.enabled()
        data = {
            "enabled": enabled,
            "name": settings.OIDC_PROVIDER_NAME,
            "login_url": oidc.login_path() if enabled else "",
        }
        return Response(SsoSerializer(data).data)


class LoginSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    password = serializers.CharField(max_length=256, style={"input_type": "password"})


@method_decorator(ensure_csrf_cookie, name="get")
class SessionView(APIView):
    """Browser sign-in. GET sets the CSRF cookie and says who is signed in: 200 with who, or 204
    while nobody is; POST signs in with a user name and password; DELETE signs out."""

    permission_classes = [AllowAny]
    throttle_classes = [WriteThrottle]
    throttle_scope = "sign-in"

    @extend_schema(responses={200: MeSerializer, 204: None})
    def get(self, request: Request) -> Response:
        # Nobody signed in is an answer to "who is signed in", not a refusal: the web app asks
        # on every visit, and a 401 here is a failed request in the browser's console each time
        # a signed-out visitor opens a page. Every endpoint that needs a user still refuses them.
        get_token(request)
        if not request.user.is_authenticated:
            return Response(status=status.HTTP_204_NO_CONTENT)
        return Response(me_data(request.user))

    @extend_schema(request=LoginSerializer, responses=MeSerializer)
    def post(self, request: Request) -> Response:
        # DRF exempts its views from Django's CSRF middleware and SessionAuthentication checks
        # the token only for a signed-in session, so a signed-out caller's POST was never
        # checked: any site could sign a visitor in as the attacker (login CSRF) with a plain
        # HTML form. The web app and `gpuportal login` GET this URL first for the cookie and
        # send it back in X-CSRFToken.
        if not request.user.is_authenticated:
            SessionAuthentication().enforce_csrf(request)
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
