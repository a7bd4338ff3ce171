"""An operator's data request to a coordinator whose job's buffer runs in a process of
its own: passed on as it came, body and all, and its answer passed back, without being
parsed here (the coordinator's interpreter stays out of the data plane). A worker's is
refused: its task says where its data goes."""

from __future__ import annotations

import urllib3
from flask import Response, request

from common.errors import ApiError
from common.http import caller
from common.messages import MAX_WAIT_S

#: The longest a passed-on request may take: a sample's long-poll, and a margin.
FORWARD_TIMEOUT_S = MAX_WAIT_S + 10.0
#: A buffer process starting or restarting refuses connections for a second or two:
#: connecting is tried again for about `CONNECT_PATIENCE_S` (nothing was sent yet).
CONNECT_PATIENCE_S = 15.0
_CONNECT_RETRIES = urllib3.Retry(
    total=None,
    connect=int(CONNECT_PATIENCE_S / 0.5),
    read=False,
    redirect=False,
    status=0,
    other=0,
    backoff_factor=0.1,
    backoff_max=0.5,
)
_POOL = urllib3.PoolManager(maxsize=8, retries=_CONNECT_RETRIES)


def forward(job_id: str, url: str) -> Response:
    """The request, sent to `url` (the buffer process of `job_id`) as it came."""
    if caller() is not None:
        raise ApiError(
            409,
            "data_elsewhere",
            f"job {job_id}'s data is served by its buffer process: send it where your "
            "task's data access says",
        )
    headers = {"Authorization": request.headers.get("Authorization", "")}
    if request.content_type:
        headers["Content-Type"] = request.content_type
    if accept := request.headers.get("Accept"):
        headers["Accept"] = accept
    try:
        answer = _POOL.request(
            request.method,
            url + request.full_path.rstrip("?"),
            body=request.get_data(),
            headers=headers,
            timeout=urllib3.Timeout(connect=5.0, read=FORWARD_TIMEOUT_S),
        )
    except urllib3.exceptions.HTTPError as exc:
        raise ApiError(
            503, "buffer_unavailable", f"job {job_id}'s buffer process: {exc}", retry_after_s=1.0
        ) from None
    return Response(
        answer.data,
        status=answer.status,
        content_type=answer.headers.get("Content-Type", "application/json"),
        headers={k: v for k, v in answer.headers.items() if k == "Retry-After"},
    )
