"""R2D2 on CartPole, written as a DI-engine config file (`main_config` and
`create_config`, EasyDicts), for `drover config show` and `drover run`.

drover reads it as DI-engine would: `create_config.env.type` cartpole is CartPole-v0
(200 steps, stop value 195); `burnin_step`, `unroll_len` and `nstep` are R2D2's own
keys, and the replayed sequences are `burnin_step + unroll_len` steps long (drover's
`policy.other.replay_buffer.sequence_length`, set from them, consecutive sequences
sharing half); DI-engine's decaying `other.eps` is dropped for Ape-X's fixed
epsilon per env, which R2D2 explores with in drover.
"""

from easydict import EasyDict

cartpole_r2d2_config = dict(
    exp_name="cartpole_r2d2_seed0",
    env=dict(
        collector_env_num=8,
        evaluator_env_num=5,
        n_evaluator_episode=5,
        stop_value=195,
    ),
    policy=dict(
        cuda=False,
        priority=True,
        priority_IS_weight=True,
        discount_factor=0.997,
        burnin_step=2,
        nstep=5,
        unroll_len=18,
        model=dict(
            obs_shape=4,
            action_shape=2,
            encoder_hidden_size_list=[128, 128],
        ),
        learn=dict(
            update_per_collect=32,
            batch_size=64,
            learning_rate=0.0005,
            target_update_freq=100,
        ),
        collect=dict(n_sample=64),
        eval=dict(evaluator=dict(eval_freq=500)),
        other=dict(
            eps=dict(type="exp", start=0.95, end=0.05, decay=10000),
            replay_buffer=dict(replay_buffer_size=10000),
        ),
    ),
)
main_config = EasyDict(cartpole_r2d2_config)

cartpole_r2d2_create_config = dict(
    env=dict(
        type="cartpole",
        import_names=["dizoo.classic_control.cartpole.envs.cartpole_env"],
    ),
    env_manager=dict(type="base"),
    policy=dict(type="r2d2"),
)
create_config = EasyDict(cartpole_r2d2_create_config)
