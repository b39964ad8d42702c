"""The tests' workloads: the shared ones (gt_bench.workloads) and a small CNN of their own."""

import torch.nn.functional as F
from torch import nn

from gt_bench.workloads import TRANSFORMER, Block, mlp, train

__all__ = ["TRANSFORMER", "Block", "SmallCNN", "mlp", "train"]


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.drop = nn.Dropout(0.25)
        self.fc = nn.Linear(8 * 4 * 4, 5)

    def forward(self, x):
        x = self.pool(F.relu(self.bn(self.conv(x))))
        return self.fc(self.drop(x.flatten(1)))
