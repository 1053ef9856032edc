"""ResNet-18 for 32x32 inputs (CIFAR variant).

The ImageNet stem (7x7 stride-2 conv + max-pool) would shrink a 32x32 image to
8x8 before the first block, so the CIFAR variant uses a 3x3 stride-1 stem.
"""

from __future__ import annotations

from torch import Tensor, nn


class BasicBlock(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU()
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes),
            )

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    def __init__(self, blocks: tuple[int, ...] = (2, 2, 2, 2), num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU()
        in_planes, stages = 64, []
        for i, count in enumerate(blocks):
            planes = 64 * 2**i
            layers = []
            for j in range(count):
                layers.append(BasicBlock(in_planes, planes, stride=2 if i > 0 and j == 0 else 1))
                in_planes = planes
            stages.append(nn.Sequential(*layers))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_planes, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.avgpool(x).flatten(1))


def resnet18_cifar(num_classes: int = 10) -> CifarResNet:
    return CifarResNet((2, 2, 2, 2), num_classes=num_classes)
