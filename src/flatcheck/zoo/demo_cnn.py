"""Tiny CNN for 1x8x8 digit images; small enough that exact Hessians are cheap."""

from __future__ import annotations

from torch import Tensor, nn


class DigitsCNN(nn.Module):
    """About 14k parameters. The BatchNorm is deliberate: it exercises the
    buffer (running stats) path of checkpoint loading in the demo."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 32, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.head = nn.Linear(32, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))
