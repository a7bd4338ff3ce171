"""A job's config, from what a user writes to what every service reads.

The layer above `common/` (the sections every job has) and `algorithms/` (each
algorithm's own sections, in its folder): it reads config files (DI-engine's
included), merges the algorithm's defaults, validates the `policy` section with the
algorithm's own config class (chosen by `policy.type`), warns about unknown keys with
did-you-mean, and checks what spans several keys.

    raw, notes = load_config("examples/cartpole_dqn.yaml")
    config, warnings = resolve_job_config(raw)     # a common.config.JobConfig
    config = fit_to_env(config)                    # model sizes from the env

    resolve.py    merge, dispatch on policy.type, unknown keys, consistency
    spaces.py     the model's sizes and action space from the env's spaces
    files.py      YAML, JSON and DI-engine Python files
    di_engine.py  DI-engine's keys and algorithm names, translated or refused
    ranks.py      whether a job's batches split over a learner group's ranks
"""

from jobconfig.files import load_config, load_config_file
from jobconfig.resolve import (
    algorithm_of,
    error_buffer_of,
    from_resolved,
    insert_rows_bound,
    min_error_buffer,
    read_job_config,
    resolve_job_config,
    sequence_length_of,
)


def __getattr__(name: str):
    # The env's spaces need gymnasium, which a client (`from drover import Client`,
    # reading a config file to submit) goes without: imported when first asked for.
    if name in ("fit_to_env", "with_spaces"):
        from jobconfig import spaces

        return getattr(spaces, name)
    raise AttributeError(f"module 'jobconfig' has no attribute {name!r}")


__all__ = [
    "algorithm_of",
    "error_buffer_of",
    "fit_to_env",
    "from_resolved",
    "insert_rows_bound",
    "load_config",
    "load_config_file",
    "min_error_buffer",
    "read_job_config",
    "resolve_job_config",
    "sequence_length_of",
    "with_spaces",
]
