"""Typed client for a learner's routes: the routes every slave shares."""

from common.slave import SlaveClient as LearnerClient

__all__ = ["LearnerClient"]
