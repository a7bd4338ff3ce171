"""Listings a page at a time, newest first (jobs, experiments): each item ordered by
(when, id), a page's token the order of its last item, so the next page starts after
it whatever was added or forgotten meanwhile.

    page, next_token = newest_first(jobs, lambda j: (j.started_at, j.job_id), limit, token)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from common.errors import bad_request

T = TypeVar("T")
Order = tuple[float, str]


def newest_first(
    items: Iterable[T], order: Callable[[T], Order], limit: int, page_token: str | None
) -> tuple[list[T], str | None]:
    """Up to `limit` items after `page_token` (None: from the newest), newest first,
    and the token of the page after (None: no more).

    Raises:
        ApiError: 400 naming `page_token` when it is not one a listing gave.
    """
    after = _order_of(page_token) if page_token else None
    ordered = sorted(items, key=order, reverse=True)
    if after is not None:
        ordered = [item for item in ordered if order(item) < after]
    page = ordered[:limit]
    more = len(ordered) > limit
    return page, _token_of(order(page[-1])) if more else None


def _token_of(order: Order) -> str:
    at, item_id = order
    return f"{at!r}/{item_id}"


def _order_of(token: str) -> Order:
    at, _, item_id = token.partition("/")
    try:
        return (float(at), item_id)
    except ValueError:
        raise bad_request("page_token", "not a token from a previous listing") from None
