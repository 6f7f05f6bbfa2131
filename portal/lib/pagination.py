"""Limit/offset pages for every list of the API."""

from __future__ import annotations

from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request

from portal.lib.query import whole_number


class LimitOffsetPages(LimitOffsetPagination):
    """DRF's limit/offset pages, with two differences: a `limit` or `offset` that is not a
    whole number in range is refused with a 400 naming the parameter (DRF ignores it and
    answers another page than the one asked for), and one page holds at most `max_limit`
    items, so that no single request reads a whole table; clients follow `next`."""

    max_limit = 1000

    def get_limit(self, request: Request) -> int | None:
        if self.limit_query_param not in request.query_params:
            return self.default_limit
        limit = whole_number(request, self.limit_query_param, minimum=1)
        return min(limit, self.max_limit)

    def get_offset(self, request: Request) -> int:
        if self.offset_query_param not in request.query_params:
            return 0
        return whole_number(request, self.offset_query_param, minimum=0)
