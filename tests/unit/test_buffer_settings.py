"""A buffer process's settings: the waiting requests it lets hold threads leave one for
a learner's sample, or it refuses to start with a line naming the variables."""

import pytest

from common.config import ReplayBufferConfig
from common.settings import SettingsError
from services.buffer.settings import BufferSettings, spec_json


def env(**extra):
    return {
        "DROVER_TOKEN": "token",
        "DROVER_BUFFER_JOB": "job-1",
        "DROVER_BUFFER_SPEC": spec_json(ReplayBufferConfig(), 0.0, 0),
        **extra,
    }


def test_waiting_inserts_are_bounded_by_default_and_by_their_variable():
    assert BufferSettings.from_env(env()).limits.max_waiting_inserts == 6
    settings = BufferSettings.from_env(env(DROVER_MAX_WAITING_INSERTS="3"))
    assert settings.limits.max_waiting_inserts == 3


@pytest.mark.parametrize(
    "variables",
    [
        {"DROVER_BUFFER_THREADS": "10"},  # 6 waiting inserts + 4 waiting samples
        {"DROVER_MAX_WAITING_INSERTS": "0"},  # unbounded: they could take every thread
    ],
)
def test_threads_that_waiting_requests_could_all_hold_are_refused(variables):
    with pytest.raises(SettingsError, match="DROVER_BUFFER_THREADS"):
        BufferSettings.from_env(env(**variables))
