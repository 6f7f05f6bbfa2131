from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, time, timedelta
from typing import Any

from django.db.models import Prefetch
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied as DRFPermissionDenied
from rest_framework.exceptions import ValidationError
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.jobs import job_templates, services
from portal.jobs.accounting import GROUPS, Usage, usage_report, with_usage_between
from portal.jobs.api.serializers import (
    BulkSubmitResultSerializer,
    BulkSubmitSerializer,
    DryRunSerializer,
    JobDetailSerializer,
    JobEventSerializer,
    JobSerializer,
    JobTemplateSerializer,
    LogLineSerializer,
    TelemetrySampleSerializer,
    TimeLimitSerializer,
    UsageReportSerializer,
)
from portal.jobs.filtersets import JobFilterSet
from portal.jobs.models import Allocation, Checkpoint, Job, JobAttempt, JobTemplate, LogLine, TelemetrySample
from portal.jobs.spec import JobSpecSerializer
from portal.lib.lookup import NamedNotFound
from portal.lib.query import StrictOrderingFilter, whole_number
from portal.lib.renderers import CSVRenderer
from portal.lib.throttling import WriteThrottle
from scheduler.dry_run import dry_run_submission

# One serializer answers every submission, as a ListSerializer's child serves every item: building
# a JobDetailSerializer builds its thirty-odd fields from the model, about a millisecond of CPU.
SUBMITTED_JOB = JobDetailSerializer()


@contextmanager
def refusals_as_api_errors() -> Iterator[None]:
    """The domain's refusals as the API's: a field to change (400) or not allowed (403). One place,
    so that a dry run answers a spec exactly as a submission does."""
    try:
        yield
    except services.JobRejected as exc:
        raise ValidationError({exc.field: [exc.message]}) from exc
    except services.PermissionDenied as exc:
        raise DRFPermissionDenied(str(exc)) from exc


class StableOrderingFilter(StrictOrderingFilter):
    """The ordering asked for, then the newest id first: many jobs share a priority or a queue
    position (none, once running), and PostgreSQL orders such ties differently from one query
    to the next, so pages of a tied ordering repeated some jobs and skipped others. Without an
    ordering asked for, the model's (newest first, then the id) applies."""

    def get_ordering(self, request: Request, queryset: Any, view: Any) -> list[str] | None:
        ordering = super().get_ordering(request, queryset, view)
        if not ordering:
            return None
        fields = list(ordering)
        if not {"id", "-id"} & set(fields):
            fields.append("-id")
        return fields


class JobViewSet(NamedNotFound, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Jobs of your tenants. POST a job spec (JSON or YAML) to submit."""

    filterset_class = JobFilterSet
    throttle_classes = [WriteThrottle]
    throttle_scope = "submit"
    # The job list's. The job's own lists (events, logs, telemetry) take none of its filters or
    # its ordering, so their actions set none, and the schema offers them none.
    filter_backends = [DjangoFilterBackend, StableOrderingFilter]
    ordering_fields = ["queue_position", "submitted_at", "priority", "id"]
    changes_nothing = False  # true for the dry run: see portal.accounts.security

    def get_queryset(self) -> Any:
        qs = Job.objects.for_user(self.request.user).select_related(
            "tenant", "virtual_cluster", "owner", "priority_class"
        )
        if self.action == "retrieve":
            allocations = Allocation.objects.select_related("node", "gpu")
            qs = qs.prefetch_related(
                Prefetch(
                    "attempts", JobAttempt.objects.prefetch_related(Prefetch("allocations", allocations))
                ),
                Prefetch(
                    "checkpoints", Checkpoint.objects.committed().newest_first().select_related("attempt")
                ),
            )
        return qs

    def get_serializer_class(self) -> Any:
        return JobDetailSerializer if self.action == "retrieve" else JobSerializer

    @extend_schema(request=JobSpecSerializer, responses={201: JobDetailSerializer})
    def create(self, request: Request) -> Response:
        spec = JobSpecSerializer(data=request.data, context={"request": request})
        spec.is_valid(raise_exception=True)
        with refusals_as_api_errors():
            job = services.submit_job(request.user, spec.validated_data)
        # The stored job is at hand with its tenant, VC, owner and class; a job this new has no
        # attempts or checkpoints. So the answer reads nothing from the database, and one that
        # goes away after the commit cannot turn a stored job into an error.
        job._prefetched_objects_cache = {"attempts": [], "checkpoints": []}
        return Response(SUBMITTED_JOB.to_representation(job), status=status.HTTP_201_CREATED)

    @extend_schema(request=JobSpecSerializer, responses={200: DryRunSerializer})
    @action(
        detail=False,
        methods=["post"],
        url_path="dry-run",
        throttle_scope="dry-run",
        changes_nothing=True,
    )
    def dry_run(self, request: Request) -> Response:
        """Test a job spec without submitting it (Slurm's `sbatch --test-only`): the same answer
        as a submission when it is refused, else whether it would start now, or why it would
        wait, until when, and what would start it sooner. Nothing is stored."""
        spec = JobSpecSerializer(data=request.data, context={"request": request})
        spec.is_valid(raise_exception=True)
        with refusals_as_api_errors():
            verdict = dry_run_submission(request.user, spec.validated_data)
        return Response(DryRunSerializer(verdict).data)

    @extend_schema(request=BulkSubmitSerializer, responses={201: BulkSubmitResultSerializer})
    @action(detail=False, methods=["post"])
    def bulk(self, request: Request) -> Response:
        """Submit a job array (up to 1,000 jobs) in one request: all are queued, or none."""
        body = BulkSubmitSerializer(data=request.data, context={"request": request})
        body.is_valid(raise_exception=True)
        try:
            jobs = services.submit_jobs(request.user, body.validated_data["specs"])
        except services.JobsRejected as exc:
            if body.validated_data["array"]:  # every copy fails alike: name the one spec
                raise ValidationError({"job": next(iter(exc.errors.values()))}) from exc
            raise ValidationError({"jobs": exc.errors}) from exc
        except services.PermissionDenied as exc:
            raise DRFPermissionDenied(str(exc)) from exc
        return Response({"count": len(jobs), "ids": [job.pk for job in jobs]}, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=JobSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        return self._change(request, "cancel", services.cancel_job)

    @extend_schema(request=None, responses=JobSerializer)
    @action(detail=True, methods=["post"])
    def top(self, request: Request, pk: str | None = None) -> Response:
        """Move a pending job to the front of its owner's pending jobs of its VC and priority
        class; other users' jobs keep their places."""
        return self._change(request, "move", services.move_to_front)

    @extend_schema(request=None, responses=JobSerializer)
    @action(detail=True, methods=["post"])
    def hold(self, request: Request, pk: str | None = None) -> Response:
        """Keep a job from starting until it is released. A pending job keeps its place; a
        running or suspended one is paused: it checkpoints and stops, freeing its GPUs, and
        waits held (409 without checkpointing, which would lose its work); a scheduled or
        starting one is stopped and held; a checkpointing one is held once it has stopped."""
        return self._change(request, "hold", services.hold_job)

    @extend_schema(request=None, responses=JobSerializer)
    @action(detail=True, methods=["post"])
    def release(self, request: Request, pk: str | None = None) -> Response:
        """Let a held job start again; a paused one resumes from its newest checkpoint."""
        return self._change(request, "release", services.release_job)

    @extend_schema(request=TimeLimitSerializer, responses=JobSerializer)
    @action(detail=True, methods=["post"], url_path="time-limit")
    def time_limit(self, request: Request, pk: str | None = None) -> Response:
        """Change a job's time limit: its owner may lower it, an admin of its tenant raise it too,
        up to its flavor's limit."""
        body = TimeLimitSerializer(data=request.data)

        def change(job: Job, user: Any) -> Job:
            body.is_valid(raise_exception=True)
            with refusals_as_api_errors():
                changed = services.change_time_limit(job, user, body.validated_data["time_limit"])
            return changed

        return self._change(request, "change the time limit of", change)

    def _change(self, request: Request, verb: str, change: Callable[[Job, Any], Job]) -> Response:
        """Applies `change` to the job of the URL for its owner or an admin of its tenant; a job
        in a state that does not allow it is a 409."""
        job = self.get_object()
        if not Job.objects.manageable_by(request.user).filter(pk=job.pk).exists():
            raise DRFPermissionDenied(
                f"You may {verb} only your own jobs, or any job of a tenant you administer."
            )
        try:
            change(job, request.user)
        except services.InvalidTransition as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(JobSerializer(self.get_queryset().get(pk=job.pk)).data)

    @extend_schema(responses=JobEventSerializer(many=True))
    @action(detail=True, methods=["get"], filter_backends=[])
    def events(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        page = self.paginate_queryset(job.events.all())
        return self.get_paginated_response(JobEventSerializer(page, many=True).data)

    @extend_schema(
        parameters=[
            OpenApiParameter("attempt", int, description="Attempt number; default the latest."),
            OpenApiParameter(
                "after", int, description="Only lines received after this line id (for following)."
            ),
            OpenApiParameter("stream", str, enum=["stdout", "stderr"]),
        ],
        responses=LogLineSerializer(many=True),
    )
    @action(detail=True, methods=["get"], filter_backends=[])
    def logs(self, request: Request, pk: str | None = None) -> Response:
        """The job's output lines, oldest first; poll with `after` to follow."""
        job = self.get_object()
        attempt = chosen_attempt(request, job)
        stream = request.query_params.get("stream")
        if stream not in (None, "stdout", "stderr"):
            raise ValidationError({"stream": [f"Give stdout or stderr, not {stream[:40]!r}."]})
        lines = LogLine.objects.filter(attempt=attempt).select_related("attempt").order_by("id")
        if "after" in request.query_params:
            lines = lines.filter(id__gt=whole_number(request, "after"))
        if stream is not None:
            lines = lines.filter(stream=stream)
        page = self.paginate_queryset(lines)
        return self.get_paginated_response(LogLineSerializer(page, many=True).data)

    @extend_schema(
        parameters=[
            OpenApiParameter("attempt", int, description="Attempt number; default the latest."),
            OpenApiParameter("after", str, description="Only samples after this ISO time (for following)."),
        ],
        responses=TelemetrySampleSerializer(many=True),
    )
    @action(detail=True, methods=["get"], filter_backends=[])
    def telemetry(self, request: Request, pk: str | None = None) -> Response:
        """Per-GPU utilization, memory, power and temperature while the job held its GPUs."""
        job = self.get_object()
        attempt = chosen_attempt(request, job)
        samples = (
            TelemetrySample.objects.filter(attempt=attempt).select_related("attempt").order_by("time", "id")
        )
        if "after" in request.query_params:
            after = parse_datetime(request.query_params["after"])
            if after is None:
                raise ValidationError({"after": ["Give an ISO 8601 time."]})
            samples = samples.filter(time__gt=after)
        page = self.paginate_queryset(samples)
        return self.get_paginated_response(TelemetrySampleSerializer(page, many=True).data)


class JobTemplateViewSet(
    NamedNotFound,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.UpdateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Saved job specs: your own and those shared in your tenants. Only the owner changes a
    template; the owner, or an admin of its tenant for a shared one, deletes it. `?name=` finds
    templates by name (the CLI's way to them)."""

    serializer_class = JobTemplateSerializer
    queryset = JobTemplate.objects.none()  # for the schema; requests use get_queryset
    filterset_fields = ["name", "shared"]
    throttle_classes = [WriteThrottle]
    throttle_scope = "templates"

    def get_queryset(self) -> Any:
        return JobTemplate.objects.visible_to(self.request.user).select_related("owner", "tenant")

    def perform_create(self, serializer: Any) -> None:
        with template_refusals_as_api_errors():
            serializer.instance = job_templates.create_template(
                self.request.user, **serializer.validated_data
            )

    def perform_update(self, serializer: Any) -> None:
        with template_refusals_as_api_errors():
            job_templates.update_template(self.request.user, serializer.instance, **serializer.validated_data)

    def perform_destroy(self, instance: JobTemplate) -> None:
        with template_refusals_as_api_errors():
            job_templates.delete_template(self.request.user, instance)


@contextmanager
def template_refusals_as_api_errors() -> Iterator[None]:
    try:
        yield
    except job_templates.TemplateRejected as exc:
        raise ValidationError(exc.errors) from exc
    except job_templates.TemplateDenied as exc:
        raise DRFPermissionDenied(str(exc)) from exc


class UsageView(APIView):
    """Accounting for a period: allocated GPU-hours, GPU-hours weighted by utilization, and
    energy, per job, VC, tenant or user, over the jobs you may see. `?format=csv` for a file.

    Only usage inside [since, until) counts, so that monthly chargebacks add up: a job that ran
    across the period's start or end is listed and charged for its part inside it."""

    renderer_classes = [JSONRenderer, CSVRenderer]

    @extend_schema(
        parameters=[
            OpenApiParameter("since", str, description="ISO date or time; default 30 days ago."),
            OpenApiParameter("until", str, description="ISO date or time; default now."),
            OpenApiParameter("group", str, enum=sorted(GROUPS), description="default: vc"),
        ],
        # The CSV export is text, not the report object.
        responses={(200, "application/json"): UsageReportSerializer, (200, "text/csv"): OpenApiTypes.STR},
    )
    def get(self, request: Request) -> Response:
        now = timezone.now()
        until = _time_param(request, "until", now)
        since = _time_param(request, "since", until - timedelta(days=30))  # the 30 days before until
        if until <= since:
            # Reversed dates are a mistake, not a period without usage: say so by name.
            raise ValidationError(
                {
                    "until": [
                        f"The period ends before it starts: until ({until:%Y-%m-%d %H:%M:%S %Z}) must be"
                        f" after since ({since:%Y-%m-%d %H:%M:%S %Z})."
                    ]
                }
            )
        group = request.query_params.get("group", "vc")
        if group not in GROUPS:
            raise ValidationError({"group": [f"One of: {', '.join(sorted(GROUPS))}."]})
        jobs = with_usage_between(Job.objects.for_user(request.user), since, until, now)
        rows = usage_report(jobs, group, since, until, now)
        if request.accepted_renderer.format == "csv":
            response = Response({"columns": [group, "jobs", *Usage().as_dict()], "results": rows})
            response["Content-Disposition"] = (
                f'attachment; filename="usage-{group}-{since:%Y%m%d}-{until:%Y%m%d}.csv"'
            )
            return response
        # Each row as `key` too (the schema's name for it), whatever the group.
        results = [{"key": str(row[group]), **row} for row in rows]
        return Response({"since": since, "until": until, "group": group, "results": results})

    def handle_exception(self, exc: Exception) -> Response:
        # A refused request answers in JSON, ?format=csv too: as CSV its message would be lost.
        self.request.accepted_renderer, self.request.accepted_media_type = (
            JSONRenderer(),
            JSONRenderer.media_type,
        )
        return super().handle_exception(exc)


def _time_param(request: Request, name: str, default: datetime) -> datetime:
    """A `since`/`until` query value as an aware datetime (naive means UTC). Django's parsers
    raise ValueError for text that looks right but names no real moment (2026-11-31, month 13,
    hour 24): that is the caller's mistake, a 400 like any other bad date, not a server error."""
    raw = request.query_params.get(name)
    if not raw:
        return default
    try:
        parsed = parse_datetime(raw) or (
            datetime.combine(d, time.min, tzinfo=UTC) if (d := parse_date(raw)) else None
        )
    except ValueError:
        parsed = None
    if parsed is None:
        raise ValidationError({name: ["Give an ISO 8601 date or time."]})
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def chosen_attempt(request: Request, job: Job) -> JobAttempt | None:
    """The attempt asked for with `attempt` (the latest without it). A number the job does
    not have is a 400 that says which it has: an empty answer would read as "no output"."""
    if "attempt" not in request.query_params:
        return job.current_attempt()
    number = whole_number(request, "attempt")
    attempt = job.attempts.filter(number=number).first()
    if attempt is None:
        count = job.attempts.count()
        has = "none yet" if not count else "1" if count == 1 else f"1 to {count}"
        raise ValidationError({"attempt": [f"Job {job.pk} has no attempt {number}; its attempts: {has}."]})
    return attempt
