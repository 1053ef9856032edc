"""Small VGG from "Sharpness can be manipulated", App. B.2, Table 6.

Kept exactly to the table (no BatchNorm, bias-free classifier) so that results
can be compared with the paper's.
"""

from __future__ import annotations

from torch import Tensor, nn


class VGGSmall(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        in_ch = 3
        for out_ch in (64, 128, 256, 512):
            layers += [nn.Conv2d(in_ch, out_ch, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
            in_ch = out_ch
        layers += [nn.AdaptiveAvgPool2d(2), nn.Flatten()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(512 * 2 * 2, num_classes, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))


def vgg_small(num_classes: int = 10) -> VGGSmall:
    return VGGSmall(num_classes=num_classes)
