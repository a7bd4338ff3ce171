"""Checking the URLs workers advertise, before the coordinator ever calls them.

A registered URL is where the scheduler sends assignments: left unchecked it would let
a registrant point the coordinator at any address (request forgery). A URL must be a
plain `http(s)://host[:port]` with a host name or an IP address; link-local,
multicast and unspecified addresses (cloud metadata services live at 169.254.169.254)
are never accepted; and an operator may narrow the hosts further with an allow-list
(`DROVER_WORKER_HOSTS`: host names, IP addresses or CIDR networks).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from urllib.parse import urlsplit

from common.errors import bad_request

_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _host_allowed(host: str, allowed: Sequence[str]) -> bool:
    ip = _ip(host)
    for entry in allowed:
        if "/" in entry and ip is not None:
            try:
                if ip in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                continue
        elif entry.lower() == host.lower():
            return True
    return False


def check_worker_url(url: str, allowed_hosts: Sequence[str] = ()) -> str:
    """The URL normalized (no trailing slash), or a 400 naming `url`.

    Raises:
        ApiError: 400 when the URL is not a plain http(s) origin, names a forbidden
            address, or a host outside the operator's allow-list.
    """
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError for a malformed or out-of-range port
    except ValueError as exc:
        raise bad_request("url", f"'{url}' is not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https"):
        raise bad_request("url", "must start with http:// or https://")
    if parts.username is not None or parts.password is not None:
        raise bad_request("url", "must not carry a user name or password")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise bad_request("url", "must be scheme://host[:port] with no path, query or fragment")
    host = parts.hostname or ""
    ip = _ip(host)
    if ip is None:
        labels = host.split(".")
        if not host or len(host) > 253 or not all(_HOST_LABEL.match(x) for x in labels):
            raise bad_request("url", f"'{host}' is not a host name or an IP address")
    elif ip.is_link_local or ip.is_multicast or ip.is_unspecified or ip.is_reserved:
        raise bad_request("url", f"{ip} is not an address a worker can be reached at")
    if allowed_hosts and not _host_allowed(host, allowed_hosts):
        raise bad_request("url", f"host '{host}' is not in this coordinator's DROVER_WORKER_HOSTS")
    netloc = f"[{host}]" if ip is not None and ip.version == 6 else host
    return f"{parts.scheme}://{netloc}" + (f":{port}" if port is not None else "")
