"""Train the bundled demo model: DigitsCNN on the embedded UCI digits (train split).

Deterministic on a given machine and torch version: fixed seed, one thread, a fixed
data order per epoch from a seeded generator. Writes demo/digits_cnn.safetensors.

    .venv/bin/python demo/train_demo.py
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from flatcheck.data.batches import SampleSet
from flatcheck.data.preprocess import Preprocess
from flatcheck.data.registry import create_dataset
from flatcheck.zoo.demo_cnn import DigitsCNN

OUT = Path(__file__).with_name("digits_cnn.safetensors")
EPOCHS, BATCH, LR = 40, 64, 0.05


def tensors(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    data = create_dataset("digits", split=split, preprocess=Preprocess(input_size=(1, 8, 8)))
    batches = list(SampleSet(data, samples=None, batch_size=len(data)))
    return batches[0].x, batches[0].y


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        return (model(x).argmax(1) == y).double().mean().item()


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    x, y = tensors("train")
    x_test, y_test = tensors("test")
    model = DigitsCNN(num_classes=10)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, weight_decay=5e-4)
    order = torch.Generator().manual_seed(0)
    for epoch in range(EPOCHS):
        model.train()
        perm = torch.randperm(len(x), generator=order)
        for i in range(0, len(x), BATCH):
            idx = perm[i : i + BATCH]
            opt.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
        if epoch % 10 == 9 or epoch == EPOCHS - 1:
            print(f"epoch {epoch + 1}: train acc {accuracy(model, x, y):.4f}  test acc {accuracy(model, x_test, y_test):.4f}")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(OUT))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
