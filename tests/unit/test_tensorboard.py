"""The TensorBoard scalar writer: what it writes reads back; failures never raise."""

import logging
import math

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from common.storage import SharedStore
from common.tensorboard import ScalarLog, job_tb_dir


def read(folder):
    events = EventAccumulator(str(folder))
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


def test_scalars_read_back_in_the_jobs_folder(tmp_path):
    store = SharedStore(tmp_path)
    log = ScalarLog(store, job_tb_dir("job-1", "learner"))
    assert not (tmp_path / "job-1").exists()  # nothing made before the first write
    log.scalars(10, {"loss/loss": 0.5, "train/updates_per_s": 40.0}, wall_time=1000.0)
    log.scalars(20, {"loss/loss": 0.25, "skipped": None, "nan": math.nan})
    log.close()
    log.close()  # twice is harmless
    log.scalars(30, {"loss/loss": 1.0})  # after close: ignored
    assert read(tmp_path / "job-1" / "tb" / "learner") == {
        "loss/loss": [(10, 0.5), (20, 0.25)],
        "train/updates_per_s": [(10, 40.0)],
    }


def test_a_failed_write_is_logged_and_silences_the_writer(tmp_path, caplog):
    store = SharedStore(tmp_path)
    (tmp_path / "job-1").mkdir()
    (tmp_path / "job-1" / "tb").write_text("a file where the folder goes")
    log = ScalarLog(store, job_tb_dir("job-1", "coordinator"))
    with caplog.at_level(logging.WARNING, logger="common.tensorboard"):
        log.scalars(1, {"buffer/size": 3.0})
        log.scalars(2, {"buffer/size": 4.0})
        log.flush()
        log.close()
    assert len([r for r in caplog.records if "stop" in r.getMessage()]) == 1
