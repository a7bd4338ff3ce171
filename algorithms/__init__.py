"""The algorithms, one folder each, and the contract they keep.

    base.py        the protocols (Algorithm, Actor, Learner) and AlgorithmSpec
    registry.py    ALGORITHMS: every algorithm by its `policy.type`, the only list of them
    step.py        the guarded optimizer step every learner takes
    checkpoint.py  the checkpoint state of a one-model learner (PPO, IMPALA)
    <name>/        __init__.py (its spec: defaults, collect unit, action
                   spaces, columns, factories), networks.py, actor.py (acting side),
                   learner.py (loss, update, checkpoint state)

The services build actors and learners from the registry, and `common/config.py` reads
it to resolve configs; the algorithms use `common/` (config sections, network building
blocks) and never import `services/`.
"""
