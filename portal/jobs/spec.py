"""The job spec: what a user submits, as JSON or YAML (documented in docs/job-spec.md).

This serializer checks the shape of each field and resolves names the caller may use (their
VCs, flavors, priority classes). Whether the job can ever fit is a domain rule, checked by
portal.jobs.services.submit_job.
"""

from __future__ import annotations

import copy
import datetime
import functools
import json
import math
import re
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, models
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.exceptions import PermissionDenied

from agents.runtime.policy import image_problems
from portal.accounts.choices import Role
from portal.accounts.models import Membership, Tenant
from portal.cluster.models import Flavor, PriorityClass, VirtualCluster
from portal.jobs.choices import DependencyType
from portal.jobs.notifications import notify_problem

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
RESERVED_ENV_PREFIXES = ("LD_", "NVIDIA_", "GPUPORTAL_")
RESERVED_ENV_NAMES = frozenset({"CUDA_VISIBLE_DEVICES"})
DURATION_RE = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s?)?$")
CHECKPOINT_SIGNALS = ("SIGUSR1", "SIGUSR2", "SIGTERM", "SIGINT")
MAX_REPLICAS = 64
MAX_DEPENDENCIES = 64
# The states a spec's `notify` may name.
NOTIFY_STATES = ["running", "succeeded", "failed", "cancelled", "timed-out", "preempted"]
# What the job API shows in place of a secret's value. Submitting it back (a clone) is refused:
# the value must be given again.
SECRET_MASK = "********"
MAX_COMMAND_BYTES = 65536
# The longest duration a spec may give (a time limit, spread_after): a year. A job's time limit is
# stored in an integer column (at most 2**31 - 1 s, some 68 years), and a longer one failed its
# insert with a 500; a year is far past any flavor's limit and any real wait.
MAX_DURATION_S = 365 * 24 * 3600
TOO_LONG = "A duration is at most 365d (a year)."


# The VC a spec names (with its tenant, and whether the user belongs to that tenant), the flavor,
# and the priority class (by name, or the default), in one statement. Through the ORM these were
# three queries on every submission, a millisecond of CPU each, mostly building the SQL.
NAMES_SQL = """
SELECT
    (SELECT jsonb_build_object(
         'vc', to_jsonb(vc), 'tenant', to_jsonb(tenant), 'member', membership.id IS NOT NULL
     )
     FROM cluster_virtualcluster AS vc
     JOIN accounts_tenant AS tenant ON tenant.id = vc.tenant_id
     LEFT JOIN accounts_membership AS membership
         ON membership.tenant_id = vc.tenant_id AND membership.user_id = %(user)s
     WHERE vc.name = %(vc)s),
    (SELECT to_jsonb(flavor) FROM cluster_flavor AS flavor WHERE flavor.name = %(flavor)s),
    (SELECT to_jsonb(pc) FROM cluster_priorityclass AS pc
     WHERE pc.name = %(priority)s OR (%(default)s AND pc.is_default))
"""


def date_problem(name: str, value: datetime.date) -> str:
    """What to say of a date given for a field: no field of a job spec or a template takes one,
    and only YAML makes one, of an unquoted 2026-01-01. DRF's own words ("Not a valid string.",
    "A valid integer is required.") leave the user to guess why 2026-01-01 is not text."""
    written = value.isoformat()
    return f"{name} cannot be a date: YAML reads an unquoted {written} as one; put the value in quotes."


class StrictSerializer(serializers.Serializer):
    """Refuses fields it does not know, rather than dropping them: a misspelt option, or one the
    portal does not offer (privileged: true), must be an error the user sees.

    An unknown field is one field error among the others, all in one answer: refused alone
    first, it hid the rest until the user had fixed it and submitted again."""

    def to_internal_value(self, data: Any) -> Any:
        keys = data if isinstance(data, Mapping) else ()
        unknown = {name: ["Unknown field."] for name in sorted(str(k) for k in keys if k not in self.fields)}
        try:
            value = super().to_internal_value(data)
        except serializers.ValidationError as exc:
            if not isinstance(data, Mapping) or not isinstance(exc.detail, dict):
                raise
            # A field refused for the date it was given says what YAML did (date_problem), in
            # place of DRF's words; the other fields' errors stay as they are.
            dates = {
                key: [date_problem(key, data[key])]
                for key in exc.detail
                if isinstance(data.get(key), datetime.date)  # a datetime too
            }
            if not dates and not unknown:
                raise
            raise serializers.ValidationError({**exc.detail, **dates, **unknown}) from None
        if unknown:
            # The known fields are fine, but the spec is refused whole: nothing of it is used.
            raise serializers.ValidationError(unknown)
        return value


def parse_duration(value: Any) -> int:
    """Seconds from an int or a string like '36h', '1d12h', '90m', '600s', at most MAX_DURATION_S:
    a longer time limit would overflow its column, a 500 instead of the user's 400."""
    if isinstance(value, bool):
        raise serializers.ValidationError("Give a duration such as 3600, '90m', '36h' or '2d'.")
    if isinstance(value, int):
        seconds = value
    elif isinstance(value, str) and value.strip():
        match = DURATION_RE.match(value.strip())
        if not match or not any(match.groups()):
            raise serializers.ValidationError(
                f"{value!r} is not a duration such as 3600, '90m', '36h' or '2d'."
            )
        if any(g and len(g) > len(str(MAX_DURATION_S)) for g in match.groups()):
            raise serializers.ValidationError(TOO_LONG)  # and int() refuses 4300 digits or more
        d, h, m, s = (int(g) if g else 0 for g in match.groups())
        seconds = ((d * 24 + h) * 60 + m) * 60 + s
    else:
        raise serializers.ValidationError("Give a duration such as 3600, '90m', '36h' or '2d'.")
    if seconds <= 0:
        raise serializers.ValidationError("The duration must be positive.")
    if seconds > MAX_DURATION_S:
        raise serializers.ValidationError(TOO_LONG)
    return seconds


def duration_text(seconds: int) -> str:
    """A duration as parse_duration reads it: '36h', '1d12h', '90m' (when not whole hours)."""
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (secs, "s")]
    return "".join(f"{n}{unit}" for n, unit in parts if n) or "0s"


@extend_schema_field({"oneOf": [{"type": "integer", "minimum": 1}, {"type": "string", "example": "36h"}]})
class DurationField(serializers.Field):
    # A YAML key left empty (`time_limit:`) is null: say what to give, not "may not be null".
    default_error_messages = {
        "null": "Give a duration such as 3600, '90m', '36h' or '2d', or leave the field out."
    }

    def to_internal_value(self, data: Any) -> int:
        return parse_duration(data)

    def to_representation(self, value: int) -> int:
        return value


@extend_schema_field(
    {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1}]}
)
class CommandField(serializers.Field):
    """A list of arguments, or one string run by the shell."""

    def to_internal_value(self, data: Any) -> list[str]:
        if isinstance(data, str):
            if not data.strip():
                raise serializers.ValidationError("The command must not be empty.")
            data = ["sh", "-c", data]
        if isinstance(data, list) and data and all(isinstance(a, str) for a in data):
            if len(data) > 1000 or sum(len(a) for a in data) > MAX_COMMAND_BYTES:
                raise serializers.ValidationError("The command is too long (at most 64 KiB).")
            if any("\x00" in a for a in data):
                raise serializers.ValidationError("The command must not contain NUL characters.")
            return data
        if isinstance(data, list) and data:
            # Name the argument that is not text: YAML reads the 3 of [train.py, --epochs, 3] as a
            # number, and "a list of strings" left the user to find it.
            index, argument = next((i, a) for i, a in enumerate(data) if not isinstance(a, str))
            raise serializers.ValidationError(
                env_value_problem(f"Argument {index + 1} of the command", argument)
            )
        raise serializers.ValidationError("Give the command as a string or a non-empty list of strings.")

    def to_representation(self, value: list[str]) -> list[str]:
        return value


class ResourcesSerializer(StrictSerializer):
    gpus = serializers.IntegerField(min_value=1, max_value=16)
    gpu_model = serializers.CharField(max_length=32)
    cpu = serializers.IntegerField(min_value=1, max_value=512)
    memory_gb = serializers.IntegerField(min_value=1, max_value=4096)


class MountSerializer(StrictSerializer):
    name = serializers.SlugField(help_text="A volume an admin allowed for the VC.")
    path = serializers.CharField(max_length=255, help_text="Where it appears inside the job.")
    read_only = serializers.BooleanField(default=True)

    def validate_path(self, value: str) -> str:
        if not value.startswith("/") or ".." in value.split("/"):
            raise serializers.ValidationError("Give an absolute path without '..'.")
        return value


MAX_RETRY_BACKOFF_S = 86400  # one day: the longest wait before a retry, asked for or doubled


class RetriesSerializer(StrictSerializer):
    limit = serializers.IntegerField(min_value=0, max_value=10, default=0)
    backoff_seconds = serializers.IntegerField(min_value=0, max_value=MAX_RETRY_BACKOFF_S, default=60)
    permanent_exit_codes = serializers.ListField(
        child=serializers.IntegerField(min_value=0, max_value=255),
        default=list,
        max_length=64,
        help_text="Exit codes that mean a retry cannot help; the job fails at once.",
    )

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, int) and not isinstance(data, bool):
            data = {"limit": data}
        return super().to_internal_value(data)


class CheckpointSettingsSerializer(StrictSerializer):
    enabled = serializers.BooleanField(default=False)
    signal = serializers.ChoiceField(choices=CHECKPOINT_SIGNALS, default="SIGUSR1")
    grace_seconds = serializers.IntegerField(min_value=1, max_value=3600, default=120)
    keep_latest = serializers.IntegerField(
        min_value=1,
        max_value=1000,
        required=False,
        help_text="Checkpoints kept besides the best (default: the cluster's CHECKPOINT_KEEP_LATEST).",
    )
    keep_best = serializers.IntegerField(
        min_value=0,
        max_value=100,
        required=False,
        help_text="Best checkpoints by the marker's metric kept as well (default: CHECKPOINT_KEEP_BEST).",
    )


def env_value_problem(name: str, value: Any, *, secret: bool = False) -> str | None:
    """Why a variable's value (or a command's argument) is not text, or None when it is.

    A job's environment is text, but YAML reads an unquoted 4.40 as the number 4.4, 0022 as 18,
    12:30 as 750, yes as true and 2026-01-01 as a date. Turning those back into text would give
    the job a value its author never wrote, silently; so anything but text is refused with the
    variable's name and the fix. The words fit a JSON body as well as YAML. A secret's value is
    never repeated, not even in an error."""
    if isinstance(value, str):
        return None
    if value is None:
        return f'{name} must be text, not null: for an empty value write "" (in YAML too).'
    if isinstance(value, bool):
        what = "true or false"
    elif isinstance(value, int | float):
        what = "a number" if secret else f"the number {value}"
    elif isinstance(value, datetime.date):  # also a datetime
        what = "a date" if secret else f"the date {value.isoformat()}"
    elif isinstance(value, list):
        what = "a list"
    elif isinstance(value, dict):
        what = "a mapping"
    else:
        what = type(value).__name__
    return (
        f"{name} must be text, not {what}: in YAML put the value in quotes as you mean it"
        " (unquoted, YAML reads 4.40 as 4.4, 0022 as 18 and 12:30 as 750)."
    )


def env_name_problem(name: Any) -> str | None:
    """Why a job may not set a variable of this name, or None when it may: a valid name, and
    none the agent sets itself. Only YAML gives a mapping keys that are not text: unquoted, it
    reads the names ON, YES, TRUE as true, OFF and NO as false, NULL as null, and 1 as a number,
    and DictField made the text "True" or "None" of them, variables nobody named."""
    if isinstance(name, str):
        if not ENV_NAME_RE.match(name):
            return f"{name!r} is not a valid variable name."
        if name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES):
            return f"{name} is reserved: the agent sets it."
        return None
    if isinstance(name, bool):
        what = "true" if name else "false"
    elif name is None:
        what = "null"
    elif isinstance(name, datetime.date):
        what = f"the date {name.isoformat()}"
    elif isinstance(name, int | float):
        what = f"the number {name}"
    else:
        what = type(name).__name__
    return (
        f"A variable name must be text, but YAML read this one as {what}: put the name in quotes"
        " (unquoted, YAML reads yes, no, on, off, true, false and null as other values)."
    )


class EnvField(serializers.DictField):
    """A job's environment variables: names to text. Refuses names and values that are not text
    before DictField and the child CharField would quietly turn them into text (see
    env_name_problem and env_value_problem), and names a job may not set. Every variable refused
    is named under its own key (env.RUN_DATE, env.LD_PRELOAD), so one answer lists them all."""

    def __init__(self, *, secret: bool = False, **kwargs: Any) -> None:
        self.secret = secret
        super().__init__(child=serializers.CharField(max_length=4096, allow_blank=True), **kwargs)

    def to_internal_value(self, data: Any) -> dict[str, str]:
        if isinstance(data, Mapping):
            errors = {
                str(name): [problem]
                for name, value in data.items()
                if (
                    problem := env_name_problem(name)
                    or env_value_problem(str(name), value, secret=self.secret)
                )
            }
            if errors:
                raise serializers.ValidationError(errors)
        return super().to_internal_value(data)


def unstorable(value: Any) -> Any:
    """Errors for the values of a parsed document that a JSON column cannot hold as they are,
    nested as DRF nests a serializer's errors (lists by index); None when there are none.

    For what is stored as written (a template's spec): YAML makes dates, NaN and infinities,
    binary strings, sets and keys that are not text, and neither json.dumps nor PostgreSQL takes
    them; stored, they would fail the request with a 500. The job spec's own check refuses
    nearly all of them by field first; this names the rest (name: .nan, which a text field
    reads as 'nan')."""
    if isinstance(value, Mapping):
        errors = {}
        for key, item in value.items():
            if not isinstance(key, str):
                errors[str(key)] = [f"A field name must be text, but YAML read {key!r} as another value."]
            elif (problem := unstorable(item)) is not None:
                errors[key] = problem
        return errors or None
    if isinstance(value, list):
        errors = {
            str(index): problem
            for index, item in enumerate(value)
            if (problem := unstorable(item)) is not None
        }
        return errors or None
    if value is None or isinstance(value, str | bool | int):
        return None
    if isinstance(value, float):
        if math.isfinite(value):
            return None
        written = ".nan" if math.isnan(value) else ".inf" if value > 0 else "-.inf"
        return [f"YAML reads an unquoted {written} as a number JSON cannot hold: put the value in quotes."]
    if isinstance(value, datetime.date):
        return [
            f"YAML reads an unquoted {value.isoformat()} as a date, which JSON cannot hold: put it in quotes."
        ]
    what = type(value).__name__
    return [f"YAML read this value as {what}, which JSON cannot hold: give text, a number or a list."]


def checked_env(value: dict[str, str]) -> dict[str, str]:
    """At most 256 variables (EnvField checks each one)."""
    if len(value) > 256:
        raise serializers.ValidationError("At most 256 variables.")
    return value


class JobSpecSerializer(StrictSerializer):
    name = serializers.CharField(max_length=100)
    vc = serializers.SlugField(help_text="The virtual cluster to queue in.")
    flavor = serializers.SlugField(required=False, help_text="A flavor name; or give resources.")
    resources = ResourcesSerializer(required=False, help_text="Per-replica resources, instead of a flavor.")
    image = serializers.CharField(max_length=300, required=False, allow_blank=True, default="")
    command = CommandField()
    env = EnvField(default=dict)
    secret_env = EnvField(
        secret=True,
        default=dict,
        help_text=(
            "Variables the job gets like env, but whose values the portal never shows again "
            f"(the job API shows {SECRET_MASK!r}), logs or sends anywhere but to the job's agents."
        ),
    )
    mounts = MountSerializer(many=True, required=False, default=list)
    replicas = serializers.IntegerField(min_value=1, max_value=MAX_REPLICAS, default=1)
    priority = serializers.SlugField(
        required=False, help_text="A priority class; default: the cluster's default."
    )
    retries = RetriesSerializer(required=False)
    checkpoint = CheckpointSettingsSerializer(required=False)
    time_limit = DurationField(required=False, help_text="Seconds or '36h'; at most the flavor's limit.")
    requeue_on_node_failure = serializers.BooleanField(
        default=True,
        help_text=(
            "When its node is lost or its processes vanish, queue the job again (a new attempt, "
            "from its last checkpoint). False: the job fails with NODE_FAIL instead, for work "
            "that must not run twice."
        ),
    )
    spread_after = DurationField(
        required=False,
        help_text=(
            "Seconds or '30m'. Once the job has waited this long since submission, it may start as "
            "one-GPU replicas (its GPUs, CPU and memory divided among them) on as many nodes as "
            "that takes, rather than wait on for nodes with room for whole replicas; for "
            "programs that start one process per GPU anyway. Jobs of more than one GPU per "
            "replica only; omitted, the job always keeps its shape."
        ),
    )
    after = serializers.ListField(
        child=serializers.IntegerField(min_value=1),
        max_length=MAX_DEPENDENCIES,
        default=list,
        help_text=(
            "Ids of jobs to wait for, with reason `dependency`; by default (after_type ok, Slurm's "
            "afterok) until they all succeeded, and the job is cancelled if one of them ends "
            "otherwise. Jobs you may see only."
        ),
    )
    after_type = serializers.ChoiceField(
        choices=DependencyType.choices,
        required=False,
        error_messages={"invalid_choice": "'{input}' is not a dependency type: give ok, any or notok."},
        help_text=(
            "When the jobs of `after` let this one start (Slurm's afterok, afterany, afternotok): "
            "ok (the default) once they all succeeded; any once they all ended, however; notok "
            "once they all ended if one failed, was cancelled or timed out, and if they all "
            "succeeded the job is cancelled."
        ),
    )
    notify = serializers.ListField(
        child=serializers.ChoiceField(choices=NOTIFY_STATES),
        max_length=len(NOTIFY_STATES),
        default=list,
        help_text=(
            "States to mail you about when the job reaches them (PAI's jobStatusChangeNotification, "
            "Slurm's --mail-type): running, succeeded, failed, cancelled, timed-out, preempted. "
            "To your account's email address."
        ),
    )
    time_sliceable = serializers.BooleanField(
        default=False,
        help_text=(
            "May take turns on its GPUs with other time-sliceable jobs of its VC when the VC has "
            "more of them than GPUs: the job is suspended (its processes paused, memory kept) and "
            "later resumed on the same GPUs. Only where the scheduler profile has time-slicing."
        ),
    )

    def validate_name(self, value: str) -> str:
        if not NAME_RE.match(value):
            raise serializers.ValidationError(
                "Use letters, digits, '.', '_' and '-', starting with a letter or digit."
            )
        return value

    def validate_image(self, value: str) -> str:
        # The agent checks again before it pulls; this says so at submission already.
        problems = image_problems(value, tuple(settings.ALLOWED_IMAGE_REGISTRIES)) if value else []
        if problems:
            raise serializers.ValidationError(problems[0][0].upper() + problems[0][1:] + ".")
        return value

    def validate_notify(self, value: list[str]) -> list[str]:
        if not value:
            return value
        # Once per request: a job array asks it of each of its jobs.
        if "notify_problem" not in self.context:
            self.context["notify_problem"] = notify_problem(self.context["request"].user)
        if self.context["notify_problem"]:
            raise serializers.ValidationError(self.context["notify_problem"])
        return sorted(set(value))

    def validate_env(self, value: dict[str, str]) -> dict[str, str]:
        return checked_env(value)

    def validate_secret_env(self, value: dict[str, str]) -> dict[str, str]:
        masked = sorted(name for name, text in value.items() if text == SECRET_MASK)
        if masked:
            raise serializers.ValidationError(
                f"Give the value of {', '.join(masked)} again: the portal shows secrets only masked."
            )
        return checked_env(value)

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            names = {
                kind: data[kind] for kind in ("vc", "flavor", "priority") if isinstance(data.get(kind), str)
            }
            if "priority" not in data:
                names["priority"] = None  # the cluster's default class
            self._load_names(names)
        return super().to_internal_value(data)

    def _load_names(self, names: dict[str, str | None]) -> None:
        """Reads what the spec names (kind: vc, flavor or priority; priority None: the default
        class) in one statement, and remembers it for the request: a job array names the same
        ones in every item."""
        cache = self.context.setdefault("spec_lookups", {})
        asked = {kind: name for kind, name in names.items() if (kind, name) not in cache}
        if not asked:
            return
        user = self.context["request"].user
        params = {
            "user": user.pk,
            "vc": asked.get("vc"),
            "flavor": asked.get("flavor"),
            "priority": asked.get("priority"),
            "default": "priority" in asked and asked["priority"] is None,
        }
        with connection.cursor() as cursor:
            cursor.execute(NAMES_SQL, params)
            vc, flavor, priority = (None if text is None else json.loads(text) for text in cursor.fetchone())
        if "vc" in asked:
            # A VC of another tenant is not there for this user.
            if vc is not None and (user.is_staff or vc["member"]):
                cache["vc", asked["vc"]] = _from_row(VirtualCluster, vc["vc"])
                cache["vc", asked["vc"]].tenant = _from_row(Tenant, vc["tenant"])
            else:
                cache["vc", asked["vc"]] = None
        if "flavor" in asked:
            cache["flavor", asked["flavor"]] = None if flavor is None else _from_row(Flavor, flavor)
        if "priority" in asked:
            pc = None if priority is None else _from_row(PriorityClass, priority)
            cache["priority", asked["priority"]] = pc

    def _named(self, kind: str, name: str | None) -> Any:
        if (kind, name) not in self.context.get("spec_lookups", {}):
            self._load_names({kind: name})
        return self.context["spec_lookups"][kind, name]

    def validate_vc(self, value: str) -> VirtualCluster:
        vc = self._named("vc", value)
        if vc is None:
            # The same words whether the VC does not exist or belongs to another tenant.
            raise serializers.ValidationError(f"No virtual cluster named {value!r} that you can submit to.")
        return vc

    def validate_flavor(self, value: str) -> Flavor:
        flavor = self._named("flavor", value)
        if flavor is None:
            names = ", ".join(Flavor.objects.values_list("name", flat=True))
            raise serializers.ValidationError(f"No flavor named {value!r}. Flavors: {names}.")
        return flavor

    def validate_priority(self, value: str) -> PriorityClass:
        pc = self._named("priority", value)
        if pc is None:
            names = ", ".join(PriorityClass.objects.values_list("name", flat=True))
            raise serializers.ValidationError(f"No priority class named {value!r}. Classes: {names}.")
        return pc

    def check_priority_allowed(self, priority: PriorityClass, vc: VirtualCluster) -> None:
        """A class above the submitter's role is refused outright (403), not a field to fix."""
        if not priority.tenant_admins_only:
            return
        user = self.context["request"].user
        cache = self.context.setdefault("spec_lookups", {})
        if ("tenant-admin", vc.tenant_id) not in cache:
            cache["tenant-admin", vc.tenant_id] = (
                user.is_staff
                or Membership.objects.filter(user=user, tenant_id=vc.tenant_id, role=Role.ADMIN).exists()
            )
        if not cache["tenant-admin", vc.tenant_id]:
            raise PermissionDenied(
                f"Priority class {priority.name} is for admins of tenant {vc.tenant.name}; "
                "ask one of them, or submit with another class."
            )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        errors: dict[str, str] = {}
        flavor: Flavor | None = attrs.get("flavor")
        resources = attrs.get("resources")
        if flavor is None and resources is None:
            errors["flavor"] = "Give a flavor or explicit resources."
        elif flavor is not None and resources is not None:
            errors["resources"] = "Give a flavor or resources, not both."
        if (
            flavor is not None
            and "time_limit" in attrs
            and attrs["time_limit"] > flavor.max_runtime_hours * 3600
        ):
            errors["time_limit"] = (
                f"A time limit of {duration_text(attrs['time_limit'])} is more than flavor "
                f"{flavor.name} allows ({duration_text(flavor.max_runtime_hours * 3600)})."
            )
        gpus_per_replica = flavor.gpus if flavor is not None else (resources or {}).get("gpus", 0)
        if "spread_after" in attrs and gpus_per_replica <= 1:
            errors["spread_after"] = (
                "Only a job of more than one GPU per replica can spread; this one has "
                f"{gpus_per_replica} per replica."
            )
        if "after_type" in attrs and not attrs.get("after"):
            # Most likely the jobs were forgotten: a type alone would wait for nothing.
            errors["after_type"] = "No jobs to wait for: list them in after, or leave after_type out."
        both = sorted(set(attrs.get("env", {})) & set(attrs.get("secret_env", {})))
        if both:
            errors["secret_env"] = f"{', '.join(both)} also in env: give each variable once."
        vc: VirtualCluster | None = attrs.get("vc")
        if vc is not None:
            allowed = {m.get("name"): m for m in vc.allowed_mounts or []}
            for mount in attrs.get("mounts", []):
                allowed_mount = allowed.get(mount["name"])
                if allowed_mount is None:
                    errors["mounts"] = f"Volume {mount['name']!r} is not allowed for VC {vc.name}."
                elif not mount["read_only"] and not allowed_mount.get("writable", False):
                    errors["mounts"] = f"Volume {mount['name']!r} may only be mounted read-only."
            # A job wider than a per-user cap of its VC would wait for its user's other jobs to
            # end, in vain. The VC is at hand here, with its caps, at no further query.
            if (flavor is None) != (resources is None):  # one of them says what a replica asks
                replicas = attrs.get("replicas", 1)
                if flavor is not None:
                    asked = (flavor.gpus, flavor.cpu, flavor.memory_gb)
                else:
                    asked = (resources["gpus"], resources["cpu"], resources["memory_gb"])
                excess = vc.per_user_excess(replicas, *asked)
                if excess:
                    field = "replicas" if replicas > 1 else "flavor" if flavor is not None else "resources"
                    errors.setdefault(field, excess)
        if "priority" not in attrs:
            default = self._named("priority", None)
            if default is None:
                errors["priority"] = "Name a priority class: the cluster has no default."
            attrs["priority"] = default
        if errors:
            raise serializers.ValidationError(errors)
        self.check_priority_allowed(attrs["priority"], attrs["vc"])
        attrs.setdefault("retries", copy.deepcopy(_defaults(RetriesSerializer)))
        attrs.setdefault("checkpoint", copy.deepcopy(_defaults(CheckpointSettingsSerializer)))
        return attrs


@functools.cache
def _defaults(serializer_class: type[serializers.Serializer]) -> dict[str, Any]:
    """What an omitted part of the spec means: its serializer's defaults (worked out once)."""
    return serializer_class().to_internal_value({})


def _from_row(model: type[models.Model], row: dict[str, Any]) -> Any:
    """A model instance from a table row as PostgreSQL's to_jsonb gives it (keys are columns)."""
    fields = model._meta.concrete_fields
    return model.from_db(
        DEFAULT_DB_ALIAS, [f.attname for f in fields], [f.to_python(row[f.column]) for f in fields]
    )
