"""Typed client for a collector's routes: the routes every slave shares."""

from common.slave import SlaveClient as CollectorClient

__all__ = ["CollectorClient"]
