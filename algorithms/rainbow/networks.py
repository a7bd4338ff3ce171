"""C51's and Rainbow's network: an observation encoder and a distributional Q head
(optionally dueling) whose layers are noisy for Rainbow.

    net = DistributionalQNetwork(config.model, noisy=True)
    net.reset_noise()                   # a fresh noise sample (noisy layers only)
    log_p = net.log_probs(obs)          # [B, actions, n_atom]: each action's return
    q = net(obs)                        # [B, actions]: expected returns
    with_noise(net, False)              # the noise-free (mean) network, to evaluate
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from algorithms.rainbow.config import C51ModelConfig, RainbowModelConfig
from common.models import make_encoder


def _scaled_noise(size: int, generator: torch.Generator | None, device: torch.device):
    """f(x) = sign(x) sqrt(|x|) of standard normal x: factorised noise's factors."""
    if generator is None:
        x = torch.randn(size, device=device)
    else:
        x = torch.randn(size, generator=generator, device=generator.device).to(device)
    return x.sign() * x.abs().sqrt()


class NoisyLinear(nn.Module):
    """A linear layer with factorised Gaussian noise (Fortunato et al. 2018):

        weight = mu_w + sigma_w * (f(e_out) f(e_in)^T),   bias = mu_b + sigma_b * f(e_out)

    with e_in, e_out standard normal, drawn by `reset_noise`; mu and sigma are
    learned. With `noisy` off it is the mean layer (mu only).

    The noise is a non-persistent buffer: a state dict (a policy file, a checkpoint)
    holds mu and sigma only.
    """

    def __init__(self, in_features: int, out_features: int, sigma0: float) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        bound = 1.0 / math.sqrt(in_features)
        sigma = sigma0 / math.sqrt(in_features)
        self.weight_mu = nn.Parameter(
            torch.empty(out_features, in_features).uniform_(-bound, bound)
        )
        self.weight_sigma = nn.Parameter(torch.full((out_features, in_features), sigma))
        self.bias_mu = nn.Parameter(torch.empty(out_features).uniform_(-bound, bound))
        self.bias_sigma = nn.Parameter(torch.full((out_features,), sigma))
        self.register_buffer("eps_in", torch.zeros(in_features), persistent=False)
        self.register_buffer("eps_out", torch.zeros(out_features), persistent=False)
        self.noisy = True
        self.reset_noise()

    def reset_noise(self, generator: torch.Generator | None = None) -> None:
        """Draw new noise. The buffers are replaced, not written in place, so a forward
        pass already taken still backpropagates through the noise it used."""
        device = self.weight_mu.device
        self.eps_in = _scaled_noise(self.in_features, generator, device)
        self.eps_out = _scaled_noise(self.out_features, generator, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.noisy:
            return F.linear(x, self.weight_mu, self.bias_mu)
        weight = self.weight_mu + self.weight_sigma * torch.outer(self.eps_out, self.eps_in)
        return F.linear(x, weight, self.bias_mu + self.bias_sigma * self.eps_out)


def noisy_layers(network: nn.Module) -> list[NoisyLinear]:
    return [m for m in network.modules() if isinstance(m, NoisyLinear)]


def with_noise(network: nn.Module, on: bool) -> None:
    """Noisy layers add their noise (on), or act as their mean layers (off)."""
    for layer in noisy_layers(network):
        layer.noisy = on


def noise_sigma(network: nn.Module) -> torch.Tensor:
    """The mean |sigma| over the noisy layers' weights (a scalar tensor): how much
    noise is left to explore with (Rainbow learns it)."""
    layers = noisy_layers(network)
    if not layers:
        return torch.zeros(())
    with torch.no_grad():
        return torch.cat([layer.weight_sigma.abs().flatten() for layer in layers]).mean()


class DistributionalQNetwork(nn.Module):
    """For each action, a categorical distribution of its return over `n_atom` atoms
    from `v_min` to `v_max` (C51, Bellemare et al. 2017).

    The head's streams (each a hidden layer of the encoder's width and an output
    layer) are dueling, as DQN's, on the atoms' logits: value + advantage - mean
    advantage, per atom. With `noisy`, their layers are `NoisyLinear` (Rainbow); the
    encoder is plain either way.
    """

    def __init__(self, config: C51ModelConfig, *, noisy: bool) -> None:
        super().__init__()
        if config.obs_shape is None or config.action_shape is None:
            raise ValueError("model.obs_shape and model.action_shape must be resolved first")
        self.num_actions, self.n_atom = config.action_shape, config.n_atom
        self.encoder = make_encoder(config)
        width = self.encoder.out_features
        if noisy:
            assert isinstance(config, RainbowModelConfig)
            sigma0 = config.sigma0

            def layer(fan_in: int, fan_out: int) -> nn.Module:
                return NoisyLinear(fan_in, fan_out, sigma0)
        else:
            layer = nn.Linear

        def stream(outputs: int) -> nn.Sequential:
            return nn.Sequential(layer(width, width), nn.ReLU(), layer(width, outputs))

        self.dueling = config.dueling
        self.advantage = stream(self.num_actions * self.n_atom)
        self.value = stream(self.n_atom) if self.dueling else None
        support = torch.linspace(config.v_min, config.v_max, config.n_atom)
        self.register_buffer("support", support, persistent=False)

    def logits(self, obs: torch.Tensor) -> torch.Tensor:
        """[B, actions, n_atom] unnormalized log-probabilities."""
        features = self.encoder(obs)
        logits = self.advantage(features).view(-1, self.num_actions, self.n_atom)
        if self.value is None:
            return logits
        value = self.value(features).unsqueeze(1)
        return value + logits - logits.mean(dim=1, keepdim=True)

    def log_probs(self, obs: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(self.logits(obs), dim=-1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """[B, actions] expected returns: the Q-values actions are chosen by."""
        return (self.log_probs(obs).exp() * self.support).sum(dim=-1)

    def reset_noise(self, generator: torch.Generator | None = None) -> None:
        for layer in noisy_layers(self):
            layer.reset_noise(generator)
