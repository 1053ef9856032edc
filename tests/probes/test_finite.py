"""No bad number leaves with exit 0: every batch's inputs, outputs and loss are checked when
a session opens, a probe's non-finite result is an error, and JSON holds numbers or null.

Data here is the embedded digits in memory, with one sample made bad at index LATER, in a
batch after the first (the first batch was all that used to be checked).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from rich.console import Console

from flatcheck import api
from flatcheck.config import ProbeRequest, RunConfig
from flatcheck.data.batches import SampleSet
from flatcheck.data.builtin import ArrayDataset, digits
from flatcheck.data.preprocess import Preprocess
from flatcheck.data.registry import DataSource, PreparedDataset
from flatcheck.errors import DataError, ModelError
from flatcheck.models.spec import LossSpec, load_spec
from flatcheck.probes.gini import GiniProbe
from flatcheck.probes.registry import parse_options
from flatcheck.report.render import summary_table
from flatcheck.report.result import ProbeResult, Report

ROOT = Path(__file__).resolve().parents[2]
CKPT = ROOT / "demo" / "digits_cnn.safetensors"
SPEC = ROOT / "model_specs" / "demo_digits.yaml"
N, BATCH, LATER = 96, 32, 70


def digit_arrays(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    data = digits(split=split).dataset
    return data.x[:N].to(torch.float32) / 16, data.y[:N].clone()


def with_sample(x: torch.Tensor, value: float, index: int = LATER) -> torch.Tensor:
    x = x.clone()
    x[index, 0, 3, 3] = value
    return x


def in_memory(x: torch.Tensor, y: torch.Tensor, split: str = "train", preprocess=Preprocess()) -> PreparedDataset:
    return PreparedDataset("memory", split, DataSource(ArrayDataset(x, y), 10, "digits in memory"), preprocess)


@pytest.fixture
def memory_data(monkeypatch):
    """Route the session's data through in-memory arrays: splits[name] = (x, y)."""
    splits = {name: digit_arrays(name) for name in ("train", "test")}

    def create(uri, *, split="train", preprocess, **_):
        return in_memory(*splits[split], split, preprocess)

    monkeypatch.setattr(api, "create_dataset", create)
    return splits


def config(probes=("gini",), loss: str | None = None, dtype="float32") -> RunConfig:
    spec = load_spec(SPEC)
    if loss is not None:
        spec = dataclasses.replace(spec, loss=LossSpec(loss))
    requests = tuple(ProbeRequest(p, parse_options(p, {})) for p in probes)
    return RunConfig(checkpoint=CKPT, spec=spec, probes=requests, data="memory", samples=N,
                     batch_size=BATCH, device="cpu", dtype=dtype)


# ---------------------------------------------------------------- inputs: the data's fault


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("cache_bytes", [2**30, 0], ids=["cached", "streamed"])
def test_non_finite_input_in_a_later_batch_is_the_data(value, cache_bytes):
    x, y = digit_arrays("train")
    with pytest.raises(DataError) as err:
        SampleSet(in_memory(with_sample(x, value), y), samples=N, batch_size=BATCH, cache_bytes=cache_bytes)
    msg = str(err.value)
    assert f"sample {LATER} " in msg and "non-finite inputs" in msg and f"({value})" in msg
    assert "'memory'" in msg and "split 'train'" in msg


# ---------------------------------------------------------------- outputs and loss: the model's


def test_outputs_that_overflow_on_a_later_sample(memory_data):
    # 1e38 is a finite float32, but the first conv's sum over it is not: the demo CNN's
    # logits for that one sample are NaN while every other sample's are finite
    memory_data["train"] = (with_sample(memory_data["train"][0], 1e38), memory_data["train"][1])
    with pytest.raises(ModelError) as err:
        api.open_session(config())
    msg = str(err.value)
    assert f"outputs are not finite on data 'memory' split 'train' sample {LATER}," in msg
    assert str(CKPT) in msg and "dtype float64" in msg


def test_huge_input_whose_loss_overflows(memory_data):
    # 1e30 in one pixel: the logits (~1e30) are finite, their squared error is not
    memory_data["train"] = (with_sample(memory_data["train"][0], 1e30), memory_data["train"][1])
    with pytest.raises(ModelError) as err:
        api.open_session(config(loss="mse"))
    msg = str(err.value)
    assert f"loss (mse) is not finite on data 'memory' split 'train' sample {LATER}," in msg


def test_other_split_is_checked_when_a_probe_asks_for_it(memory_data):
    memory_data["test"] = (with_sample(memory_data["test"][0], 1e38), memory_data["test"][1])
    session = api.open_session(config())
    with pytest.raises(ModelError, match=f"split 'test' sample {LATER},"):
        session.split_samples("test")


def test_label_out_of_range_in_a_later_batch(memory_data):
    y = memory_data["train"][1].clone()
    y[LATER] = 10
    memory_data["train"] = (memory_data["train"][0], y)
    with pytest.raises(DataError, match=r"data 'memory' has label 10 but the model has 10 outputs"):
        api.open_session(config())


# ---------------------------------------------------------------- results


@pytest.mark.parametrize("field, bad, dtype, hint", [
    ("value", math.nan, "float32", "overflows in float32 (try dtype float64)"),
    ("stderr", math.inf, "float32", "overflows in float32 (try dtype float64)"),
    ("value", -math.inf, "float64", "overflows even in float64"),
])
def test_non_finite_result_is_an_error(memory_data, monkeypatch, field, bad, dtype, hint):
    honest = GiniProbe.run

    def broken(self, ctx, options):
        return dataclasses.replace(honest(self, ctx, options), **{field: bad})

    monkeypatch.setattr(GiniProbe, "run", broken)
    with pytest.raises(ModelError) as err:
        api.run(config(dtype=dtype))
    assert str(err.value).startswith(f"probe gini gave a non-finite {field} ({bad}) ") and hint in str(err.value)


def result(**kw) -> ProbeResult:
    fields = dict(probe="p", value=1.5, stderr=0.25, matvecs=3, seconds=0.1, label="q")
    return ProbeResult(**{**fields, **kw})


def refuse(constant: str):
    raise ValueError(f"JSON constant {constant} in a report")


def test_json_writes_null_for_non_finite_numbers():
    details = {"a": math.nan, "b": [math.inf, 2.0], "c": {"d": -math.inf}, "e": torch.tensor(math.nan)}
    report = Report(meta={"m": math.nan}, results={"p": result(details=details)})
    text = json.dumps(report.to_dict(), allow_nan=False)
    data = json.loads(text, parse_constant=refuse)
    assert data["m"] is None
    assert data["results"]["p"]["details"] == {"a": None, "b": [None, 2.0], "c": {"d": None}, "e": None}
    assert (data["results"]["p"]["value"], data["results"]["p"]["stderr"]) == (1.5, 0.25)


def test_headline_never_written_as_a_string():
    data = result(value=math.nan, stderr=math.inf).to_dict()
    assert data["value"] is None and data["stderr"] is None


def test_table_does_not_print_nan():
    report = Report(meta=_meta(), results={"p": result(value=math.nan, stderr=math.nan)})
    console = Console(record=True, width=200)
    console.print(summary_table(report))
    text = console.export_text()
    assert "nan" not in text.lower() and "—" in text


def _meta() -> dict:
    return {"model": {"arch": "a", "probed_parameters": 1, "loss": "cross_entropy"}, "bn_mode": "eval",
            "device": "cpu", "dtype": "float32", "seed": 0,
            "data": {"name": "d", "split": "train", "samples": 1}}


def test_report_summary_of_an_old_nan_report_writes_null(tmp_path):
    from tests.support.cli import invoke
    from tests.support.records import record, write_jsonl

    recs = [record(f"m{i}", float(i + 1), float(i * i)) for i in range(4)]
    recs[2]["results"]["sharp"].update(value="nan", stderr="inf")  # as schema-1 reports wrote them
    res = invoke("report", write_jsonl(tmp_path / "old.jsonl", recs), "--x", "sharp", "--y", "mls.normalized",
                 "--json", "-", "--bootstrap", "100")
    assert res.exit_code == 0, res.stderr
    models = {m["model"]: m for m in json.loads(res.stdout, parse_constant=refuse)["models"]}
    assert models["m2"]["values"]["sharp"] == {"value": None, "stderr": None}
    assert models["m1"]["values"]["sharp"] == {"value": 2.0, "stderr": pytest.approx(0.2)}
