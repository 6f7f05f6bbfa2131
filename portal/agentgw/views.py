"""The agent realm's one HTTP endpoint: `POST /agent/enroll/`, where an agent exchanges a
one-time enrollment token (`Authorization: Bearer gpe_...`) for its node's own token.

No session, no CSRF, no user API token: the enrollment token is the only credential it reads.
"""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from portal.cluster import services as cluster_services

REFUSED = {
    401: "Invalid, used or expired enrollment token.",
    403: "This enrollment token cannot enroll this node.",
}


@csrf_exempt
@require_POST
def enroll(request: HttpRequest) -> JsonResponse:
    """Body: {"node_name": "gpu-017"} (optional when the token names the node). Answers 201
    with {"node_name", "token"}; the token is shown once and stored only hashed."""
    scheme, _, raw = request.headers.get("Authorization", "").partition(" ")
    try:
        body: Any = json.loads(request.body or b"{}")
        node_name = str(body.get("node_name") or "")
    except (ValueError, AttributeError):
        return JsonResponse({"detail": 'Send JSON: {"node_name": "..."}.'}, status=400)
    try:
        node, token = cluster_services.enroll_node(
            raw.strip() if scheme == "Bearer" else "", node_name, request.META.get("REMOTE_ADDR", "")
        )
    except cluster_services.EnrollmentRefused as refused:
        return JsonResponse({"detail": REFUSED[refused.status]}, status=refused.status)
    except ValueError as exc:
        return JsonResponse({"detail": str(exc)}, status=400)
    return JsonResponse({"node_name": node.name, "token": token}, status=201)
