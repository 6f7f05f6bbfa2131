from __future__ import annotations

from typing import Any

import django_filters
from django.db.models import Q

from portal.jobs.choices import JobState
from portal.jobs.models import Job

MAX_JOB_ID = 2**63 - 1  # a job's id is a PostgreSQL bigint


class JobFilterSet(django_filters.FilterSet):
    state = django_filters.MultipleChoiceFilter(choices=JobState.choices)
    vc = django_filters.CharFilter(field_name="virtual_cluster__name")
    owner = django_filters.CharFilter(method="filter_owner", help_text="A user name, or 'me'.")
    q = django_filters.CharFilter(method="filter_search", help_text="Searches names and ids.")

    class Meta:
        model = Job
        fields = ["state", "vc", "owner", "q"]

    def filter_owner(self, queryset: Any, name: str, value: str) -> Any:
        if value == "me":
            return queryset.filter(owner=self.request.user)
        return queryset.filter(owner__username=value)

    def filter_search(self, queryset: Any, name: str, value: str) -> Any:
        """Names containing `value`, and the job whose id it is. Only a decimal number that fits
        the id column is tried as an id: isdigit() also takes digits int() refuses (such as
        "²"), and a larger number makes PostgreSQL refuse the whole query; both were a 500."""
        condition = Q(name__icontains=value)
        if value.isdecimal() and len(value) <= len(str(MAX_JOB_ID)) and int(value) <= MAX_JOB_ID:
            condition |= Q(pk=int(value))
        return queryset.filter(condition)
