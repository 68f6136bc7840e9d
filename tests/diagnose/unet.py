"""A diffusers-style UNet at its smallest: sinusoidal time embedding, ResNet blocks with GroupNorm,
SiLU, a time-embedding projection and ``output_scale_factor``, skip connections, down- and upsampling.

Module paths follow diffusers' ``UNet2DModel`` (``down_blocks.0.resnets.0``,
``up_blocks.0.resnets.1.time_emb_proj``), so what diagnose names reads as it would on the real model.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def timestep_embedding(timesteps: torch.Tensor, dim: int) -> torch.Tensor:
    """diffusers' ``get_timestep_embedding``: a float32 ``arange`` scaled, then sin and cos."""
    half = dim // 2
    exponent = -math.log(10000) * torch.arange(half, dtype=torch.float32, device=timesteps.device) / half
    angles = timesteps[:, None].float() * torch.exp(exponent)[None, :]
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)


class ResnetBlock(nn.Module):
    def __init__(self, channels_in: int, channels_out: int, time_dim: int, groups: int, output_scale_factor: float = 1.0):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, channels_in)
        self.conv1 = nn.Conv2d(channels_in, channels_out, 3, padding=1)
        self.time_emb_proj = nn.Linear(time_dim, channels_out)
        self.norm2 = nn.GroupNorm(groups, channels_out)
        self.conv2 = nn.Conv2d(channels_out, channels_out, 3, padding=1)
        self.conv_shortcut = nn.Conv2d(channels_in, channels_out, 1) if channels_in != channels_out else None
        self.output_scale_factor = output_scale_factor

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        hidden = self.conv1(F.silu(self.norm1(x)))
        hidden = hidden + self.time_emb_proj(F.silu(temb))[:, :, None, None]  # TIME LINE
        hidden = self.conv2(F.silu(self.norm2(hidden)))
        shortcut = self.conv_shortcut(x) if self.conv_shortcut is not None else x  # SHORTCUT LINE
        return (shortcut + hidden) / self.output_scale_factor  # OUTPUT LINE


class DownBlock(nn.Module):
    def __init__(self, channels_in: int, channels_out: int, time_dim: int, groups: int, layers: int, downsample: bool):
        super().__init__()
        self.resnets = nn.ModuleList(
            ResnetBlock(channels_in if i == 0 else channels_out, channels_out, time_dim, groups) for i in range(layers)
        )
        self.downsampler = nn.Conv2d(channels_out, channels_out, 3, stride=2, padding=1) if downsample else None

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        skips = []
        for resnet in self.resnets:
            x = resnet(x, temb)
            skips.append(x)
        if self.downsampler is not None:
            x = self.downsampler(x)
            skips.append(x)
        return x, skips


class UpBlock(nn.Module):
    def __init__(self, channels_in: int, channels_out: int, skip_channels: list[int], time_dim: int, groups: int, upsample: bool):
        super().__init__()
        self.resnets = nn.ModuleList(
            ResnetBlock((channels_in if i == 0 else channels_out) + skip, channels_out, time_dim, groups)
            for i, skip in enumerate(skip_channels)
        )
        self.upsampler = nn.Conv2d(channels_out, channels_out, 3, padding=1) if upsample else None

    def forward(self, x: torch.Tensor, skips: list[torch.Tensor], temb: torch.Tensor) -> torch.Tensor:
        for resnet in self.resnets:
            x = resnet(torch.cat([x, skips.pop()], dim=1), temb)
        if self.upsampler is not None:
            x = self.upsampler(F.interpolate(x, scale_factor=2.0, mode="nearest"))
        return x


class TinyUNet(nn.Module):
    """Two down blocks, a middle ResNet, two up blocks (``channels=(8, 16)``, GroupNorm of 4 groups)."""

    def __init__(self, channels: tuple[int, int] = (8, 16), layers: int = 1, groups: int = 4, in_channels: int = 3):
        super().__init__()
        first, second = channels
        time_dim = first * 4
        self.first = first
        self.time_embedding = nn.Sequential(nn.Linear(first, time_dim), nn.SiLU(), nn.Linear(time_dim, time_dim))
        self.conv_in = nn.Conv2d(in_channels, first, 3, padding=1)
        self.down_blocks = nn.ModuleList(
            [DownBlock(first, first, time_dim, groups, layers, True), DownBlock(first, second, time_dim, groups, layers, False)]
        )
        self.mid_block = ResnetBlock(second, second, time_dim, groups)
        # the skips' channels in the order the down path makes them; each up block takes layers + 1, deepest first
        skips = [first, *[first] * layers, first, *[second] * layers]
        up_skips = [[skips.pop() for _ in range(layers + 1)] for _ in range(2)]
        self.up_blocks = nn.ModuleList(
            [
                UpBlock(second, second, up_skips[0], time_dim, groups, True),
                UpBlock(second, first, up_skips[1], time_dim, groups, False),
            ]
        )
        self.conv_norm_out = nn.GroupNorm(groups, first)
        self.conv_out = nn.Conv2d(first, in_channels, 3, padding=1)

    def forward(self, sample: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
        temb = self.time_embedding(timestep_embedding(timesteps, self.first).to(sample.dtype))  # as diffusers casts it
        x = self.conv_in(sample)
        skips = [x]
        for block in self.down_blocks:
            x, block_skips = block(x, temb)
            skips.extend(block_skips)
        x = self.mid_block(x, temb)
        for block in self.up_blocks:
            x = block(x, skips, temb)
        return self.conv_out(F.silu(self.conv_norm_out(x)))


def tiny_unet(**sizes: int) -> tuple[TinyUNet, tuple[torch.Tensor, torch.Tensor]]:
    """A seeded model, a batch of two 8x8 images and their timesteps."""
    torch.manual_seed(0)
    model = TinyUNet(**sizes)  # type: ignore[arg-type]
    return model, (torch.randn(2, 3, 8, 8), torch.tensor([10, 500]))
