"""Typed client for a learner's routes: the routes every slave shares."""

from services.slave.client import SlaveClient as LearnerClient

__all__ = ["LearnerClient"]
