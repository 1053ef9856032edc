"""`flatcheck scan` on timm's tiny test models (random init, synthetic data, 8 samples):
records, failures, interruption and resume, offline pretrained lookup, 2-rank sharding."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.cli import ROOT, invoke
from tests.support.scan import CHEAP, FAST, lines, models_file, scan, subprocess_env
from tests.support.proc import HANG_GUARD

# float64: the single-process and per-rank scans run with different thread counts, and
# float32 reductions in another order differ by ~1e-5 relative on the trace

pytestmark = pytest.mark.workflow  # whole workflows, seconds each: make test-all only


TINY = ["--probes", "gini,trace", "-o", "trace.probes_max=2", "-o", "trace.block_size=2", "--dtype", "float64"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny scan: ViT + CNNs with gini and a 2-probe trace, one unknown model among them."""
    folder = tmp_path_factory.mktemp("scan")
    names = ["test_vit", "test_resnet", "not_a_timm_model", "test_convnext"]
    out = folder / "scan.jsonl"
    t0 = time.perf_counter()
    res = scan("--models-file", models_file(folder, names), *TINY, "--out", out)
    return res, out, names, time.perf_counter() - t0


def test_tiny_scan_records_every_model_and_survives_a_failure(tiny):
    res, out, names, seconds = tiny
    # the scan goes on past the failed model, and then says it failed: exit 1 (--allow-errors: 0)
    assert res.exit_code == 1, res.stderr
    assert "1 of 4 models failed (not_a_timm_model)" in res.stderr and "--allow-errors" in res.stderr
    # every line on stderr says whose it is, as docs/guide/running.md promises (the failure count did not)
    said = [line for line in res.stderr.splitlines() if line.strip() and not line.startswith(" ")]
    assert said and all(line.startswith(("flatcheck", "error:")) for line in said), res.stderr
    recs = lines(out)
    assert [r["model"] for r in recs] == names
    by = {r["model"]: r for r in recs}
    bad = by.pop("not_a_timm_model")
    assert bad["status"] == "error" and "unknown timm model" in bad["error"] and "\n" not in bad["error"]
    for r in by.values():
        assert r["status"] == "ok" and r["error"] is None, r["error"]
        assert set(r["results"]) == {"gini", "trace"} and r["results"]["trace"]["stderr"] is not None
        assert r["meta"]["model"]["arch"] == r["model"]
        assert r["meta"]["data"]["samples"] == 8
    print(f"tiny scan: {len(names)} models in {seconds:.1f}s")


def test_existing_output_needs_resume_or_overwrite(tiny):
    _, out, _, _ = tiny
    res = scan("--timm", "test_resnet", "--probes", "gini", "--out", out)
    assert res.exit_code == 2 and "--resume" in res.stderr
    res = scan("--timm", "no_such_family_*", "--probes", "gini", "--out", out.with_name("x.jsonl"))
    assert res.exit_code == 2 and res.stderr.startswith("error: ")


@pytest.mark.parametrize("flags", [["--overwrite"], ["--resume"]])
def test_an_output_that_is_no_scan_file_is_left_whole(tmp_path, flags):
    """`--out` naming the data, a checkpoint or a spec by mistake: --overwrite emptied it and a
    resume cut its last "line"; every model then failed on the destroyed input."""
    import numpy as np

    data = tmp_path / "d.npz"
    np.savez(data, x=np.zeros((8, 3, 8, 8), np.float32), y=np.zeros(8, np.int64))
    before = data.read_bytes()
    res = scan("--timm", "test_resnet", "--probes", "gini", "--out", data, *flags)
    assert res.exit_code == 2, res.stderr
    assert res.stderr.startswith(f"error: --out {data}: exists and is not a flatcheck scan or tracker file")
    assert data.read_bytes() == before


def test_a_resume_under_other_run_settings_is_refused_before_anything_runs(tmp_path):
    # it measured every model again beside the old records, and `report` then refused the file
    out = tmp_path / "s.jsonl"
    assert scan("--timm", "test_resnet", "--probes", "gini", "--samples", "8", "--out", out).exit_code == 0
    before = out.read_bytes()
    res = scan("--timm", "test_resnet", "--probes", "gini", "--samples", "4", "--out", out, "--resume")
    assert res.exit_code == 2 and "holds records made with other run settings (samples 8 vs 4)" in res.stderr
    assert out.read_bytes() == before
    # the same settings resume as before: nothing left to do
    res = scan("--timm", "test_resnet", "--probes", "gini", "--samples", "8", "--out", out, "--resume")
    assert res.exit_code == 0 and out.read_bytes() == before


def test_a_resume_under_other_shard_settings_is_refused(tmp_path):
    """`--shard 0/3 --resume` on the file a `--shard 0/2` run wrote (both are OUT.rank0) dealt
    the models out otherwise and measured this shard's again beside the other's."""
    out = tmp_path / "s.jsonl"
    models = ["--timm", "test_resnet", "--timm", "test_vit", "--probes", "gini", "--samples", "4", "--out", out]
    assert scan(*models, "--shard", "0/2").exit_code == 0
    shard = tmp_path / "s.jsonl.rank0"
    before = shard.read_bytes()
    res = scan(*models, "--shard", "0/3", "--resume")
    assert res.exit_code == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "holds the records of shard 0/2 (--shard 0/2), not of shard 0/3" in res.stderr
    assert shard.read_bytes() == before
    assert scan(*models, "--shard", "0/2", "--resume").exit_code == 0 and shard.read_bytes() == before


def test_a_typo_in_a_model_flag_is_refused_before_the_scan_starts(tmp_path):
    # recorded as an error after the other models had run (exit 1); a typed name is bad input
    res = scan("--model", "timm:test_vitt", "--model", "timm:test_resnet", "--probes", "gini",
               "--out", tmp_path / "s.jsonl")
    assert res.exit_code == 2 and "--model timm:test_vitt: unknown timm model 'test_vitt'; did you mean test_vit" \
        in res.stderr
    assert not (tmp_path / "s.jsonl").exists()
    res = scan("--model", "torchvision:resnet1", "--probes", "gini", "--out", tmp_path / "t.jsonl")
    assert res.exit_code == 2 and "unknown torchvision model 'resnet1'" in res.stderr


def test_retry_errors_without_resume_is_refused(tmp_path):
    # it only changes which records a resumed scan keeps: alone it did nothing, silently
    res = scan("--timm", "test_resnet", "--probes", "gini", "--retry-errors", "--out", tmp_path / "s.jsonl")
    assert res.exit_code == 2 and "--retry-errors needs --resume" in res.stderr
    assert not (tmp_path / "s.jsonl").exists()


@pytest.mark.process
def test_interrupted_scan_resumes_without_redoing_or_duplicating(tmp_path):
    out = tmp_path / "scan.jsonl"
    mf = models_file(tmp_path, CHEAP)
    cmd = [sys.executable, "-m", "flatcheck", "scan", "--models-file", str(mf), "--probes", "gini", *FAST,
           "--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.time() + HANG_GUARD
    while time.time() < deadline and proc.poll() is None:
        if out.exists() and out.read_bytes().count(b"\n") >= 1:
            proc.send_signal(signal.SIGINT)
            break
        time.sleep(0.02)
    _, stderr = proc.communicate(timeout=HANG_GUARD)
    before = lines(out)
    assert before, "no model finished"
    if proc.returncode != 0:  # interrupted mid-scan (not finished before the signal landed)
        assert proc.returncode == 130 and "--resume" in stderr
        # the command said it; the entry point not again
        assert [line for line in stderr.splitlines() if line.startswith("interrupted")] == [
            f"interrupted; every finished model is in {out}; continue with --resume"], stderr
    # and a crash mid-write leaves a partial line, which resume must cut off
    with open(out, "ab") as fh:
        fh.write(b'{"model": "test_convnext", "status": "o')
    res = scan("--models-file", mf, "--probes", "gini", "--out", out, "--resume")
    assert res.exit_code == 0, res.stderr
    after = lines(out)
    assert [r["model"] for r in after] == CHEAP  # each once, in order
    assert after[:len(before)] == before  # finished models were not redone


def test_pretrained_weights_only_from_local_disk(tmp_path, monkeypatch):
    import timm
    from safetensors.torch import save_file

    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty_hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "empty_torch"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    name = "test_resnet.r160_in1k"
    mf = models_file(tmp_path, [name])
    out = tmp_path / "skipped.jsonl"
    res = scan("--models-file", mf, "--pretrained", "--probes", "gini", "--out", out)
    assert res.exit_code == 0, res.stderr
    (rec,) = lines(out)
    assert rec["status"] == "skipped" and "no local pretrained weights" in rec["error"]
    assert str(tmp_path / "empty_hf") in rec["error"] and "never downloads" in rec["error"]
    assert "HF_HUB_OFFLINE" not in os.environ  # forced offline only during the scan

    weights = tmp_path / "weights"
    weights.mkdir()
    model = timm.create_model(name, pretrained=False)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(weights / f"{name}.safetensors"))
    out = tmp_path / "local.jsonl"
    res = scan("--models-file", mf, "--pretrained", "--weights-dir", weights, "--probes", "gini", "--out", out)
    assert res.exit_code == 0, res.stderr
    (rec,) = lines(out)
    assert rec["status"] == "ok" and rec["meta"]["checkpoint"]["path"].endswith(f"{name}.safetensors")


@pytest.mark.realsize
def test_two_ranks_cover_the_single_process_scan(tiny, tmp_path):
    _, single_out, names, _ = tiny
    out = tmp_path / "scan.jsonl"
    mf = models_file(tmp_path, names)
    # the real launcher: torchrun sets RANK/WORLD_SIZE/LOCAL_RANK for 2 CPU processes
    env = subprocess_env()
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "flatcheck", "scan", "--models-file", str(mf), *TINY, *FAST, "--allow-errors",
                           "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, env=env, timeout=HANG_GUARD)
    assert proc.returncode == 0, proc.stderr[-2000:]
    shards = [lines(out.with_name(f"scan.jsonl.rank{r}")) for r in range(2)]
    assert [r["model"] for r in shards[0]] == names[0::2] and [r["model"] for r in shards[1]] == names[1::2]
    assert not out.exists()
    merged = {r["model"]: r for shard in shards for r in shard}
    single = {r["model"]: r for r in lines(single_out)}
    assert merged.keys() == single.keys()
    for name, rec in single.items():
        got = merged[name]
        assert (got["status"], got["fingerprint"]) == (rec["status"], rec["fingerprint"])
        for probe, r in rec["results"].items():
            # same seeded init, data and probe draws: the same numbers up to float64 summation order
            assert got["results"][probe]["value"] == pytest.approx(r["value"], rel=1e-10, abs=1e-12)


# ---------------------------------------------------------------- a model per child process

BUILDERS = '''
import os
import signal


def killed(**kwargs):
    """Dies as the kernel's OOM killer would end it: SIGKILL, no exception, no cleanup."""
    ballast = bytearray(64 * 2**20)  # touched, so the child's peak memory shows it
    ballast[::4096] = b"x" * len(ballast[::4096])
    os.kill(os.getpid(), signal.SIGKILL)


def out_of_memory(**kwargs):
    raise MemoryError("cannot allocate 1.2 TB")
'''


def python_spec(arch: str) -> str:
    return f"source: python\narch: {arch}\nnum_classes: 10\ninput_size: [1, 8, 8]\nloss: cross_entropy\n"


@pytest.mark.process
def test_a_model_whose_process_is_killed_is_recorded_and_the_scan_goes_on(tmp_path, monkeypatch):
    import shutil

    # python-source models, imported under the trust rule (--trust-package)
    pkg = tmp_path / "pkgs"
    pkg.mkdir()
    (pkg / "doomed_models.py").write_text(BUILDERS)
    monkeypatch.syspath_prepend(str(pkg))
    folder = tmp_path / "ckpts"
    folder.mkdir()
    for name, arch in (("a_killed", "doomed_models:killed"), ("b_memory", "doomed_models:out_of_memory"),
                       ("c_demo", "flatcheck.zoo.demo_cnn:DigitsCNN")):
        shutil.copy(ROOT / "demo" / "digits_cnn.safetensors", folder / f"{name}.safetensors")
        (folder / f"{name}.yaml").write_text(python_spec(arch))
    out = tmp_path / "scan.jsonl"
    # a command's own process, as a user runs it: a long-lived process (this test session) may
    # be one that cannot fork for autograd, and the scan would then run the killer in it
    res = subprocess.run([sys.executable, "-m", "flatcheck", "scan", "--checkpoints", str(folder), "--trust-package",
                          "doomed_models", "--probes", "gini", "--data", "digits", "--samples", "16", "-q",
                          "--allow-errors", "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([str(pkg), os.environ.get("PYTHONPATH", "")])})
    assert res.returncode == 0, res.stderr
    killed, memory, demo = lines(out)
    assert [r["model"] for r in (killed, memory, demo)] == ["a_killed", "b_memory", "c_demo"]
    # the parent wrote the killed child's record: the signal, and its peak memory from wait4
    assert killed["status"] == "error" and "killed by SIGKILL" in killed["error"] and "OOM" in killed["error"]
    assert killed["process"]["signal"] == signal.SIGKILL and killed["process"]["exit_code"] is None
    assert killed["process"]["peak_rss_bytes"] >= 64 * 2**20  # the ballast it touched
    assert f"{killed['process']['peak_rss_bytes'] / 2**30:.2f} GiB" in killed["error"]
    # a MemoryError is the model's own error, reported by the child, which then exits normally
    assert memory["status"] == "error" and "MemoryError: cannot allocate 1.2 TB" in memory["error"]
    assert memory["process"]["exit_code"] == 0 and memory["process"]["signal"] is None
    assert demo["status"] == "ok" and demo["results"]["gini"]["value"] is not None
    assert demo["process"]["peak_rss_bytes"] > 0 and demo["process"]["signal"] is None
    # the rest of the record is a scan record like any other, resumable
    assert killed["kind"] == "flatcheck.scan" and killed["fingerprint"] and killed["settings"]["data"] == "digits"
    res = invoke("scan", "--checkpoints", folder, "--trust-package", "doomed_models", "--probes", "gini",
                 "--data", "digits", "--samples", "16", "-q", "--out", out, "--resume", "--allow-errors")
    assert res.exit_code == 0 and len(lines(out)) == 3


def test_the_child_does_not_keep_the_output_locked(tmp_path):
    """The held output's descriptor is closed in the child: its flock is the parent's alone."""
    import fcntl

    from flatcheck.workflows import child_process
    from flatcheck.workflows.results_io import HeldOutput

    out = tmp_path / "scan.jsonl"
    with HeldOutput(out, "--out") as held:
        def work(send):
            send(["probe", 1, 2, None, None])
            return {"holds": _holds(held.fd, out)}

        got = []
        outcome = child_process.run_in_child(work, on_message=got.append, close_in_child=(held.fd,))
    assert outcome.result == {"holds": False} and got == [["probe", 1, 2, None, None]]
    assert outcome.exit_code == 0 and outcome.signal is None and outcome.died is None
    fd = os.open(out, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again once the parent let go
    os.close(fd)


def _holds(fd: int, path: Path) -> bool:
    # the number may be open again for something else (the child's own stdout copy)
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except OSError:
        return False


# ---------------------------------------------------------------- --shard I/N


def test_shards_cover_the_single_process_scan(tiny, tmp_path):
    _, single_out, names, _ = tiny
    out = tmp_path / "scan.jsonl"
    mf = models_file(tmp_path, names)
    for i in range(3):
        res = scan("--models-file", mf, *TINY, "--out", out, "--shard", f"{i}/3", "--allow-errors")
        # shard 2 holds only the unknown model: a shard in which no model succeeded is exit 1
        assert res.exit_code == (1 if i == 2 else 0), res.stderr
    shards = [lines(out.with_name(f"scan.jsonl.rank{i}")) for i in range(3)]
    assert [[r["model"] for r in s] for s in shards] == [names[i::3] for i in range(3)]
    assert [s[0]["rank"] for s in shards] == [0, 1, 2] and {s[0]["world_size"] for s in shards} == {3}
    single = {r["model"]: r for r in lines(single_out)}
    for rec in (r for s in shards for r in s):
        assert rec["fingerprint"] == single[rec["model"]]["fingerprint"]
        for probe, r in single[rec["model"]]["results"].items():
            assert rec["results"][probe]["value"] == r["value"]  # same process layout: bit for bit
    res = invoke("report", out, "--fields", "gini", "--json", "-", "-q")
    assert res.exit_code == 0, res.stderr
    assert sorted(m["model"] for m in json.loads(res.stdout)["models"]) == sorted(names)


@pytest.mark.parametrize("text", ["3/3", "1", "a/b", "-1/2", "0/0"])
def test_shard_is_checked(tmp_path, text):
    res = scan("--timm", "test_resnet", "--probes", "gini", "--out", tmp_path / "s.jsonl", "--shard", text)
    assert res.exit_code == 2 and res.stderr.startswith("error: --shard") and "\n" not in res.stderr.strip()
    assert not (tmp_path / "s.jsonl").exists()
    if text == "0/0":
        assert "N, the number of shards, must be at least 1" in res.stderr


def test_a_shard_with_no_model_says_so(tmp_path):
    """More shards than models: shard 1 of 2 over one model wrote an empty file and said nothing."""
    out = tmp_path / "s.jsonl"
    res = invoke("scan", *[a for a in FAST if a != "-q"], "--timm", "test_resnet", "--probes", "gini", "--out", out,
                 "--shard", "1/2")
    assert res.exit_code == 0 and out.with_name("s.jsonl.rank1").read_text() == ""
    assert "no model falls to this shard (1 models over 2 shards)" in res.stderr, res.stderr


def test_shard_is_refused_under_torchrun(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    res = scan("--timm", "test_resnet", "--probes", "gini", "--out", tmp_path / "s.jsonl", "--shard", "0/2")
    assert res.exit_code == 2 and "torchrun" in res.stderr


# ---------------------------------------------------------------- a folder of training checkpoints


@pytest.mark.parametrize("stem, want", [
    ("step_000200", {"step": 200}), ("model-step=1500", {"step": 1500}), ("epoch=12", {"epoch": 12}),
    ("epoch=3-step=1500", {"epoch": 3, "step": 1500}), ("ckpt_Step42", {"step": 42}),
    ("timestep_5", {}), ("final", {}), ("step_1_step_2", {}), ("resnet50", {})])
def test_step_and_epoch_from_names(stem, want):
    from flatcheck.workflows.trajectory import from_name

    assert from_name(stem) == want


def test_checkpoint_folder_records_step_and_epoch(tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    folder = tmp_path / "run"
    folder.mkdir()
    shutil.copy(ROOT / "model_specs" / "demo_digits.yaml", folder / "spec.yaml")
    demo = ROOT / "demo" / "digits_cnn.safetensors"
    for name in ("step_000200", "model-step=1500", "epoch=12"):
        shutil.copy(demo, folder / f"{name}.safetensors")
    tensors = load_file(str(demo))
    save_file(tensors, str(folder / "last.safetensors"), metadata={"step": "3000", "epoch": "14"})
    save_file(tensors, str(folder / "step_9.safetensors"), metadata={"step": "soon"})
    out = tmp_path / "run.jsonl"
    res = invoke("scan", "--checkpoints", folder, "--probes", "gini", "--data", "digits", "--samples", "16", "-q",
                 "--out", out)
    assert res.exit_code == 0, res.stderr
    got = {r["model"]: r for r in lines(out)}
    assert {m: (r["step"], r["epoch"]) for m, r in got.items()} == {
        "epoch=12": (None, 12), "last": (3000, 14), "model-step=1500": (1500, None), "step_000200": (200, None),
        "step_9": (None, None)}
    assert got["last"]["trajectory_from"] == {"step": "metadata", "epoch": "metadata"}
    assert got["step_000200"]["trajectory_from"] == {"step": "file name"}
    bad = got["step_9"]
    assert bad["status"] == "skipped" and "metadata field 'step' is 'soon', expected an integer" in bad["error"]
    # one run: the folder's checkpoints are one line along the steps, in step order
    assert {r["run"] for r in got.values() if r["step"] is not None} == {"run"} and got["epoch=12"]["run"] == "run"
    png = tmp_path / "run.png"
    res = invoke("report", out, "--x", "step", "--y", "gini", "--json", "-", "-q", "--plot", png)
    assert res.exit_code == 0, res.stderr
    rows = [r for r in json.loads(res.stdout)["models"] if r.get("step") is not None]
    assert [r["step"] for r in rows] == [200, 1500, 3000]
    assert json.loads(res.stdout)["plot"]["points"] == 3


# ---------------------------------------------------------------- the paper's protocol


def test_preset_runs_the_mls_vs_sharpness_protocol(tmp_path):
    import shutil

    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copy(ROOT / "model_specs" / "demo_digits.yaml", folder / "spec.yaml")
    for name in ("cnn_a", "cnn_b"):
        shutil.copy(ROOT / "demo" / "digits_cnn.safetensors", folder / f"{name}.safetensors")
    out = tmp_path / "fig4.jsonl"
    res = invoke("scan", "--checkpoints", folder, "--preset", "mls-vs-sharpness", "--data", "digits", "--samples",
                 "16", "-o", "adaptive-sharpness.probes_max=4", "-o", "adaptive-sharpness.noise_draws=2", "-q",
                 "--out", out)
    assert res.exit_code == 0, res.stderr
    assert "mls.normalized_mls" in res.stdout  # the table shows the field the figure plots
    (a, b) = lines(out)
    probes = dict(a["settings"]["probes"])
    assert list(probes) == ["adaptive-sharpness", "mls"] and a["settings"]["samples"] == 16  # the user's flag wins
    assert probes["adaptive-sharpness"]["loss"] == "sigmoid_mse" and probes["adaptive-sharpness"]["probes_max"] == 4
    assert a["results"]["adaptive-sharpness"]["details"]["loss"] == "sigmoid_mse"
    assert a["results"]["mls"]["details"]["normalized_mls"] > 0
    assert probes["mls"]["output"] == a["results"]["mls"]["details"]["output"] == "sigmoid"  # as App. F
    # Fig. 4 plots normalized MLS: the per-layer NMLS is not taken
    assert probes["mls"]["nmls"] is False and a["results"]["mls"]["details"]["nmls"] is None
    # 4 probes leave this model's S_ρ at a few 1e-7 either side of 0; the figure is drawn from
    # positive values, and a value ≤ 0, which log axes cannot show, is named, or refused when
    # every value is one
    png = tmp_path / "fig4.png"
    for values in ((2e-9, 1e-9), (-1e-9, 1e-9)):
        for rec, v in zip((a, b), values):
            rec["results"]["adaptive-sharpness"]["value"] = v
        out.write_text("".join(json.dumps(r) + "\n" for r in (a, b)))
        if values[0] > 0:
            res = invoke("report", out, "--preset", "mls-vs-sharpness", "--plot", png, "-q")
            assert res.exit_code == 0, res.stderr
            assert png.read_bytes().startswith(b"\x89PNG")
    res = invoke("report", out, "--preset", "mls-vs-sharpness", "--plot", png)
    assert res.exit_code == 0 and "1 of 2 models" in res.stderr and "-1e-09" in res.stderr, res.stderr
    b["results"]["adaptive-sharpness"]["value"] = 0.0
    out.write_text("".join(json.dumps(r) + "\n" for r in (a, b)))
    res = invoke("report", out, "--preset", "mls-vs-sharpness", "--plot", png)
    assert res.exit_code == 2 and "every model" in res.stderr and "log axes" in res.stderr, res.stderr
    # records measured without the preset (cross entropy, logits) are not drawn under its labels
    # "S_ρ (sigmoid + MSE)" and "MLS of σ(f)" (stranger test: exit 0 and a mislabelled figure)
    b["results"]["adaptive-sharpness"]["value"] = 1e-9
    b["results"]["mls"]["details"]["output"] = "logits"
    out.write_text("".join(json.dumps(r) + "\n" for r in (a, b)))
    res = invoke("report", out, "--preset", "mls-vs-sharpness", "--plot", png)
    assert res.exit_code == 2 and b["model"] in res.stderr and "mls.details.output 'logits'" in res.stderr
    assert "--logx --logy" in res.stderr and res.stderr.count("\n") == 1, res.stderr
    res = invoke("report", out, "--x", "adaptive-sharpness", "--y", "mls.normalized_mls", "--logx", "--logy",
                 "--plot", png, "-q")
    assert res.exit_code == 0, res.stderr
    res = invoke("scan", "--checkpoints", folder, "--preset", "fig9", "--out", tmp_path / "x.jsonl")
    assert res.exit_code == 2 and "mls-vs-sharpness" in res.stderr


def test_scan_refuses_a_data_root_without_the_sets_files_before_any_model(tmp_path):
    """Told once, up front, instead of an error record per model after each one loaded."""
    out = tmp_path / "s.jsonl"
    res = invoke("scan", "--model", "torchvision:resnet18", "--data", "cifar10", "--data-root", tmp_path,
                 "--out", out, "-q")
    assert res.exit_code == 2 and res.stderr.count("\n") == 1, res.stderr
    assert f"expected {tmp_path / 'cifar-10-batches-py' / 'data_batch_1'} (not found)" in res.stderr
    assert not out.exists()


def test_scan_records_whose_file_goes_during_the_scan_are_kept(tmp_path, monkeypatch):
    """--out's folder removed while the models run: the records, appended to a file no path
    names any more, are written to a temporary file the error names after the table (exit 2).
    The file alone removed: they are written at --out again, with a warning (exit 0)."""
    import shutil

    from flatcheck.workflows import results_io
    from tests.support.outputs import lose_folder_after

    ckpts = tmp_path / "ckpts"
    ckpts.mkdir()
    for name in ("a", "b"):
        shutil.copy(ROOT / "demo" / "digits_cnn.safetensors", ckpts / f"{name}.safetensors")
    shutil.copy(ROOT / "model_specs" / "demo_digits.yaml", ckpts / "spec.yaml")
    args = ["--checkpoints", ckpts, "--probes", "gini", "--data", "digits", "--samples", "16", "-q"]
    folder, spare = lose_folder_after(monkeypatch, results_io.HeldOutput, "append", tmp_path)
    res = invoke("scan", *args, "--out", folder / "s.jsonl")
    assert res.exit_code == 2, res.stderr
    assert all(f"│ {m} " in res.stdout for m in "ab")  # the table of the scan
    [kept] = spare.iterdir()
    [line] = res.stderr.strip().splitlines()
    assert line.startswith(f"error: --out {folder / 's.jsonl'}: cannot write") and f"in {kept} instead" in line
    assert "the scan's own exit code: 0" in line
    assert sorted(r["model"] for r in lines(kept)) == ["a", "b"]

    out = tmp_path / "again" / "s.jsonl"
    out.parent.mkdir()
    monkeypatch.undo()
    real = results_io.HeldOutput.append

    def append_then_remove_the_file(self, record):
        real(self, record)
        out.unlink(missing_ok=True)

    monkeypatch.setattr(results_io.HeldOutput, "append", append_then_remove_the_file)
    res = invoke("scan", *args, "--out", out)
    assert res.exit_code == 0, res.stderr
    assert "was removed during the scan; its 2 records are written there again" in res.stderr
    assert sorted(r["model"] for r in lines(out)) == ["a", "b"]


def test_scan_takes_models_by_name_with_the_shared_spec_flags(tmp_path):
    """--model REF (repeatable) as every probe command reads it, with --num-classes/--input-size/
    --set applied to each model and recorded with where each field came from; a reference that
    cannot be read is refused up front (exit 2), before any model runs."""
    from flatcheck.workflows.scan_sources import family

    out = tmp_path / "s.jsonl"
    r = invoke("scan", "--model", "timm:test_vit", "--model", "torchvision:resnet18", "--num-classes", "7",
                "--input-size", "3,32,32", "--set", "loss=mse", "--data", "synthetic", "--samples", "4",
                "--batch-size", "4", "--probes", "gini", "--out", str(out), "-q")
    assert r.exit_code == 0, r.output
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(x["model"], x["status"], x["origin"], x["family"]) for x in recs] == [
        ("timm:test_vit", "ok", "model", "test"), ("torchvision:resnet18", "ok", "model", "resnet")]
    for rec in recs:
        model = rec["meta"]["model"]
        assert model["num_classes"] == 7 and model["resolved_spec"]["input_size"] == [3, 32, 32]
        assert model["loss"] == "mse" and model["spec_origins"]["num_classes"] == "flag --num-classes"
        assert model["spec_origins"]["loss"] == "flag --set loss"
    assert family("hf-hub:timm/vit_small_patch16_224.augreg_in21k") == "vit"

    bad = invoke("scan", "--model", "timm", "--model", "torchvision:resnet18", "--out", str(tmp_path / "b.jsonl"))
    assert bad.exit_code == 2 and "--model expects" in bad.output
    assert not (tmp_path / "b.jsonl").exists()
    bad = invoke("scan", "--checkpoints", str(tmp_path), "--num-classes", "3", "--out", str(tmp_path / "c.jsonl"))
    assert bad.exit_code == 2 and "checkpoint folder" in bad.output


def test_a_budget_is_part_of_a_scans_settings():
    """A budget stops iterative probes early, so a budgeted record is not comparable with an
    unbudgeted one: its fingerprint differs (no --resume across them) and report's settings
    differ; without a budget the fingerprint is the one earlier scans wrote."""
    import dataclasses
    from pathlib import Path

    from flatcheck.config import RunConfig, probe_requests
    from flatcheck.workflows.results_io import run_settings_of
    from flatcheck.workflows.scan import fingerprint, run_settings
    from flatcheck.workflows.scan_sources import timm_entry

    base = RunConfig(checkpoint=None, spec=Path("<per model>"), probes=probe_requests("trace", {}))
    budgeted = dataclasses.replace(base, budget=60.0)
    entry = timm_entry("test_vit", pretrained=False, kwargs={}, input_size=None, weights_dir=None)
    assert "budget" not in run_settings(base) and run_settings(budgeted)["budget"] == 60.0
    assert fingerprint(entry, base) != fingerprint(entry, budgeted)
    records = [{"settings": run_settings(c), "results": {"trace": {}}} for c in (base, budgeted)]
    a, b = (run_settings_of(r, with_options=True) for r in records)
    assert a != b and (a["budget"], b["budget"]) == (None, 60.0)


def test_tf32_is_part_of_a_scans_settings_when_on():
    """TF32 products moved the demo's lmax 18 times its certified bound on an H200: a scan resumed
    with --allow-tf32 toggled must not mix its records. Off, the fingerprint is the earlier one."""
    import dataclasses
    from pathlib import Path

    from flatcheck.config import RunConfig, probe_requests
    from flatcheck.workflows.results_io import run_settings_of
    from flatcheck.workflows.scan import fingerprint, run_settings
    from flatcheck.workflows.scan_sources import timm_entry

    base = RunConfig(checkpoint=None, spec=Path("<per model>"), probes=probe_requests("trace", {}))
    tf32 = dataclasses.replace(base, allow_tf32=True)
    entry = timm_entry("test_vit", pretrained=False, kwargs={}, input_size=None, weights_dir=None)
    assert "allow_tf32" not in run_settings(base) and run_settings(tf32)["allow_tf32"] is True
    assert fingerprint(entry, base) != fingerprint(entry, tf32)
    a, b = (run_settings_of({"settings": run_settings(c), "results": {"trace": {}}}, with_options=True)
            for c in (base, tf32))
    assert a != b and (a["allow_tf32"], b["allow_tf32"]) == (None, True)


FORK = """
import sys, torch
from flatcheck.workflows import child_process
if sys.argv[1] == "fresh":
    child_process.mark_fresh_process()  # as the entry point of a flatcheck command does
torch.set_num_threads(2)
with child_process.parent_without_pool() as n:
    a = torch.randn(1500, 1500)
    (a @ a).sum()  # on one thread
    out = child_process.run_in_child(lambda send: [float((a @ a).sum()), torch.get_num_threads()], threads=n)
print(n, out.result[1], out.threads, out.exit_code, torch.get_num_threads())
"""


@pytest.mark.process
def test_a_forked_child_uses_threads_only_where_its_parent_cannot_have_used_the_pool():
    """A forked child cannot use an OpenMP pool its parent used (it waits forever for pool
    threads it does not have), and whether a process has used it cannot be asked: a child runs
    torch on one thread unless its parent is a flatcheck command's fresh process, kept on one
    thread while it forks (parent_without_pool); that child gets the command's thread count. In
    fresh interpreters under a timeout, so that a hang fails the test instead of the suite."""
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    for mode, expected in (("fresh", ["2", "2", "2", "0", "2"]), ("library", ["1", "1", "1", "0", "2"])):
        out = subprocess.run([sys.executable, "-c", FORK, mode], capture_output=True, text=True, timeout=HANG_GUARD,
                             env=env)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == expected, mode
    # a parent that used the pool on 2 threads: its child on one thread finishes
    used = FORK.replace("with child_process.parent_without_pool() as n:", "(torch.randn(1500, 1500) @ "
                        "torch.randn(1500, 1500)).sum()\nwith child_process.parent_without_pool() as n:")
    out = subprocess.run([sys.executable, "-c", used, "library"], capture_output=True, text=True, timeout=HANG_GUARD, env=env)
    assert out.returncode == 0 and out.stdout.split() == ["1", "1", "1", "0", "2"], out.stderr


def test_a_process_that_cannot_fork_for_autograd_scans_in_itself_and_says_so(tmp_path, monkeypatch):
    """Where a forked child could not run autograd (child_process.fork_works), the models run in
    the scan's own process, with a warning that a model killed for memory then ends the scan."""
    from flatcheck.workflows import child_process

    assert child_process.fork_works() in (True, False)
    monkeypatch.setattr(child_process, "fork_works", lambda: False)
    out = tmp_path / "s.jsonl"
    with pytest.warns(UserWarning, match="cannot fork a child that runs autograd"):
        res = invoke("scan", "--model", "timm:test_vit", "--num-classes", "3", "--input-size", "3,32,32", "--data",
                     "synthetic", "--samples", "4", "--batch-size", "4", "--probes", "gini", "--out", out)
    assert res.exit_code == 0, res.stderr
    (rec,) = lines(out)
    assert rec["status"] == "ok" and "process" not in rec


FORK_WORKS = """
from flatcheck.workflows import child_process
print(child_process.fork_works())
"""


@pytest.mark.process
def test_a_fresh_process_can_fork_for_autograd():
    out = subprocess.run([sys.executable, "-c", FORK_WORKS], capture_output=True, text=True, timeout=HANG_GUARD)
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr


# ---------------------------------------------------------------- exit codes, and resume after files changed


def demo_folder(folder: Path) -> Path:
    import shutil

    folder.mkdir()
    shutil.copy(ROOT / "model_specs" / "demo_digits.yaml", folder / "spec.yaml")
    for name in ("a", "b"):
        shutil.copy(ROOT / "demo" / "digits_cnn.safetensors", folder / f"{name}.safetensors")
    (folder / "broken.safetensors").write_bytes(b"not a checkpoint")
    return folder


def test_a_failed_model_is_exit_1_and_a_resume_after_files_changed_reports_each_model_once(tmp_path):
    """`scan` exited 0 with "4 ok, 4 error"; after a checkpoint changed, a broken one was fixed
    and one added, `scan --resume` re-measured just those, but `report` counted the stale and the
    new record of each, and a resume with nothing to do printed an empty table (stranger test)."""
    import shutil

    from safetensors.torch import load_file, save_file

    folder = demo_folder(tmp_path / "ck")
    out = tmp_path / "s.jsonl"
    args = ["--checkpoints", folder, "--probes", "gini", "--data", "digits", "--samples", "16", "--out", out]
    res = invoke("scan", *args, "-q")
    assert res.exit_code == 1 and "1 of 3 models failed (broken)" in res.stderr and "--retry-errors" in res.stderr
    assert invoke("scan", *args, "-q", "--resume", "--allow-errors").exit_code == 0  # 2 of 3 succeeded
    demo = ROOT / "demo" / "digits_cnn.safetensors"
    save_file({k: 2 * v for k, v in load_file(str(demo)).items()}, str(folder / "b.safetensors"))
    shutil.copy(demo, folder / "broken.safetensors")
    shutil.copy(demo, folder / "c.safetensors")
    res = invoke("scan", *args, "--resume")
    assert res.exit_code == 0, res.stderr
    # one line, whole, off a terminal: as the table's title it wrapped mid-phrase (stranger22)
    assert "3 ok, 0 error, 0 skipped; 1 already done (1 ok, 0 error, 0 skipped)" in res.stdout.splitlines()[0]
    assert [r["model"] for r in lines(out)] == ["a", "b", "broken", "b", "broken", "c"]
    res = invoke("report", out, "--fields", "gini", "--json", "-")
    assert res.exit_code == 0, res.stderr
    rows = {m["model"]: m for m in json.loads(res.stdout)["models"]}
    assert sorted(rows) == ["a", "b", "broken", "c"] and {m["status"] for m in rows.values()} == {"ok"}
    assert rows["b"]["values"]["gini"]["value"] == lines(out)[3]["results"]["gini"]["value"]  # the new weights'
    assert "left out 2 superseded records" in res.stderr
    res = invoke("scan", *args, "--resume")
    assert res.exit_code == 0, res.stderr
    assert "nothing left to do, all 4 models are already in it (4 ok, 0 error, 0 skipped" in " ".join(
        res.stdout.split())


def test_a_scan_in_which_no_model_succeeded_is_exit_1_even_allowing_errors(tmp_path):
    res = scan("--models-file", models_file(tmp_path, ["not_a_model", "nor_this"]), "--probes", "gini",
               "--allow-errors", "--out", tmp_path / "s.jsonl")
    assert res.exit_code == 1 and "2 of 2 models failed (not_a_model, nor_this); none succeeded" in res.stderr
    assert "Traceback" not in res.stderr and res.stderr.count("\n") == 1


def test_every_probe_of_a_scanned_model_ends_its_line_with_its_value(tmp_path):
    """stranger20: a scan's probe end lines lacked the headline (`a: trace (exact): done · 1/1`)
    and its counts within a block never came, since the scan's callback dropped the display's
    hooks; each ok model's gini and trace lines now end with their values."""
    out = tmp_path / "scan.jsonl"
    quiet = FAST.index("-q")
    res = invoke("scan", *FAST[:quiet], *FAST[quiet + 1:], "--models-file",
                 models_file(tmp_path, ["test_vit", "test_resnet"]), *TINY, "--out", out)
    assert res.exit_code == 0, res.stderr
    for r in lines(out):
        if r["status"] != "ok":
            continue
        for desc, result in (("gini", r["results"]["gini"]), ("trace (hutchinson)", r["results"]["trace"])):
            head = f"flatcheck {r['model']}: {desc}: done · "
            ends = [line for line in res.stderr.splitlines() if line.startswith(head)]
            assert len(ends) == 1, res.stderr
            assert f"{result['value']:.4g}" in ends[0].split(" · ")[-1], ends[0]


def test_a_scan_childs_hooks_reach_the_parents_display_in_order():
    """What a scan's child sends (workflows.scan._Forward), delivered in the parent (_deliver):
    every hook of the display, with its arguments through JSON; a plain callback gets counts only."""
    import json as _json

    from flatcheck.workflows.scan import _deliver, _Forward

    sent = []
    forward = _Forward(lambda msg: sent.append(_json.loads(_json.dumps(msg))))
    forward.began("trace")
    forward("trace (hutchpp)", 0, 0)
    forward.within(3, 8, 2, ahead=(10, 0.5))
    forward.within(0, 0, 0, anew=True)
    forward.budget("trace (hutchpp)", 4.0)
    forward("trace (hutchpp)", 6, 6, value=7.0, stderr=float("nan"))
    forward.stopped("trace (hutchpp)", "budget", 30)
    forward.ended("trace", 7.0, 0.4, 1)
    forward.ended("lmax", 2.1, None, None, 1.4e-7)  # an iteration's bound crosses too

    heard = []

    class Display:
        def __call__(self, desc, done, total, **estimate):
            heard.append(("progress", desc, done, total, estimate))

        def __getattr__(self, kind):
            return lambda *args, **kwargs: heard.append((kind, args, kwargs))

    for msg in sent:
        _deliver(Display(), msg)
    assert heard == [
        ("began", ("trace",), {}),
        ("progress", "trace (hutchpp)", 0, 0, {"value": None, "stderr": None}),
        ("within", (3, 8, 2), {"built": 0.0, "anew": False, "ahead": (10, 0.5)}),
        ("within", (0, 0, 0), {"built": 0.0, "anew": True, "ahead": None}),
        ("budget", ("trace (hutchpp)", 4.0), {}),
        ("progress", "trace (hutchpp)", 6, 6, {"value": 7.0, "stderr": None}),
        ("stopped", ("trace (hutchpp)", "budget", 30), {}),
        ("ended", ("trace", 7.0, 0.4, 1, None), {}),
        ("ended", ("lmax", 2.1, None, None, 1.4e-7), {}),
    ]
    counts = []
    for msg in sent:
        _deliver(lambda desc, done, total, **estimate: counts.append((desc, done)), msg)
    assert counts == [("trace (hutchpp)", 0), ("trace (hutchpp)", 6)]
