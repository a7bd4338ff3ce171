"""Typed client for a collector's routes: the routes every slave shares."""

from services.slave.client import SlaveClient as CollectorClient

__all__ = ["CollectorClient"]
