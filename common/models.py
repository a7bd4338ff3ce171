"""Network building blocks and weight conversion shared by the algorithms (whose own
networks live in `algorithms/<name>/networks.py`), the learner and the collector."""

from __future__ import annotations

import torch
from torch import nn

from common.config import ModelConfig, obs_shape_of


def mlp(sizes: list[int]) -> nn.Sequential:
    """ReLU layers of the given sizes (an encoder: no output layer)."""
    layers: list[nn.Module] = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
        layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
    return nn.Sequential(*layers)


def state_to_numpy(module: nn.Module) -> dict:
    """A module's parameters as CPU numpy arrays (for a safetensors policy file)."""
    return {k: v.detach().cpu().numpy() for k, v in module.state_dict().items()}


def load_numpy_state(module: nn.Module, tensors: dict) -> None:
    """Load parameters from numpy arrays; raises if names or shapes differ."""
    module.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in tensors.items()})


# --- observation encoders ------------------------------------------------------------
#
# Every network's first module: it takes observations as the envs give them (float32
# vectors, or uint8 images channels first, which it scales to [0, 1] itself so that
# step data and batches stay uint8 until they reach the device).


def encoder_kind(model: ModelConfig) -> str:
    """The encoder a model uses: its `encoder`, or for `auto` the one its observations
    call for (vectors: mlp; images of 36 pixels a side or more: nature_cnn; smaller
    images: conv)."""
    if model.encoder != "auto":
        return model.encoder
    shape = obs_shape_of(model)
    if len(shape) == 1:
        return "mlp"
    return "nature_cnn" if min(shape[1:]) >= 36 else "conv"


class ObsEncoder(nn.Module):
    """Observations to a feature vector of `out_features`: the model's encoder body
    after the input's cast (and scaling, for uint8)."""

    def __init__(self, body: nn.Module, out_features: int, scale: bool) -> None:
        super().__init__()
        self.body = body
        self.out_features = out_features
        self.scale = scale

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.float()
        if self.scale:
            x = x / 255.0
        return self.body(x)


def make_encoder(model: ModelConfig, *, activation: type[nn.Module] = nn.ReLU) -> ObsEncoder:
    """The observation encoder a model's config asks for.

    mlp: `encoder_hidden_size_list` layers of `activation`. The CNNs end in one fully
    connected ReLU layer of the list's last size (Nature DQN: 512).
    """
    shape = obs_shape_of(model)
    hidden = list(model.encoder_hidden_size_list)
    kind = encoder_kind(model)
    scale = model.obs_dtype == "uint8"
    if kind == "mlp":
        layers: list[nn.Module] = []
        for fan_in, fan_out in zip([shape[0], *hidden[:-1]], hidden, strict=True):
            layers += [nn.Linear(fan_in, fan_out), activation()]
        return ObsEncoder(nn.Sequential(*layers), hidden[-1], scale)
    channels = shape[0]
    if kind == "nature_cnn":
        # Mnih et al. 2015: 32 8x8/4, 64 4x4/2, 64 3x3/1.
        convs: nn.Module = nn.Sequential(
            nn.Conv2d(channels, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
            nn.Flatten(),
        )  # fmt: skip
    elif kind == "conv":
        # Small images (MiniGrid's 7x7 view): 3x3 convolutions that keep the size.
        convs = nn.Sequential(
            nn.Conv2d(channels, 16, 3, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
            nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
            nn.Flatten(),
        )  # fmt: skip
    elif kind == "impala_resnet":
        convs = ImpalaResNet(channels)
    else:
        raise ValueError(f"unknown encoder {kind!r}")
    with torch.no_grad():
        flat = int(convs(torch.zeros(1, *shape)).shape[1])
    body = nn.Sequential(convs, nn.Linear(flat, hidden[-1]), nn.ReLU())
    return ObsEncoder(body, hidden[-1], scale)


class _Residual(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


class ImpalaResNet(nn.Sequential):
    """IMPALA's deep encoder (Espeholt et al. 2018): three stacks of a 3x3 convolution,
    a 3x3 max-pool of stride 2 and two residual blocks, with 16, 32 and 32 channels."""

    def __init__(self, in_channels: int, depths: tuple[int, ...] = (16, 32, 32)) -> None:
        layers: list[nn.Module] = []
        for depth in depths:
            layers += [
                nn.Conv2d(in_channels, depth, 3, padding=1),
                nn.MaxPool2d(3, stride=2, padding=1),
                _Residual(depth),
                _Residual(depth),
            ]
            in_channels = depth
        super().__init__(*layers, nn.ReLU(), nn.Flatten())
