"""The entry point (flatcheck.entry): what it refuses before torch is imported, and the
collector it turns off while the command's modules are imported and back on to run it."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

import pytest

from flatcheck.entry import _missing_weights, imports_done
from flatcheck.models.discover import NO_WEIGHTS
from tests.support.cli import CKPT as DEMO, SPEC as DEMO_SPEC
from tests.support.proc import HANG_GUARD

# a print at exit of whether torch was ever imported, then the command line run by the entry point
_RUN = ("import sys, atexit; atexit.register(lambda: print('torch imported:', 'torch' in sys.modules)); "
        "sys.argv = ['flatcheck', *{argv!r}]; from flatcheck.entry import main; main()")


@pytest.mark.process
@pytest.mark.parametrize("argv", [
    ["trace", "--model", "timm:test_vit", "--data", "digits", "--num-classes", "10", "--input-size", "3,32,32"],
    ["lmax", f"--spec={DEMO_SPEC}", "--data", "digits", "-q", "--k", "1"],
])
def test_a_run_without_weights_is_refused_before_torch_is_imported(argv):
    """--model or --spec with no CHECKPOINT, --pretrained or --random-init: the line the model
    resolver gives, exit 2, and no import of torch to say it."""
    proc = subprocess.run([sys.executable, "-c", _RUN.format(argv=argv)], capture_output=True, text=True,
                          timeout=HANG_GUARD)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"error: {NO_WEIGHTS}"], proc.stderr
    assert proc.stdout.strip() == "torch imported: False"


def test_the_resolver_says_the_same_line():
    from flatcheck.errors import ConfigError
    from flatcheck.models.resolve import ModelRequest, resolve

    with pytest.raises(ConfigError) as caught:
        resolve(ModelRequest(spec=Path(DEMO_SPEC)))
    assert str(caught.value) == NO_WEIGHTS


@pytest.mark.parametrize("argv", [
    ["trace", str(DEMO), "--spec", str(DEMO_SPEC)],  # the CHECKPOINT
    ["trace", "--no-layers", str(DEMO), "--spec", str(DEMO_SPEC)],  # after a switch: the CHECKPOINT
    ["trace", "--model", "timm:test_vit", "--random-init"],
    ["trace", "--model", "timm:test_vit", "--pretrained"],
    ["trace", "--model", "timm:test_vit", "--bogus"],  # the parser's to refuse
    ["trace", "--model", "timm:test_vit", "--help"],
    ["trace", "--model", "timm:test_vit", "--", "weights.pt"],
    ["trace", "--model", "timm:test_vit", "--spec", str(DEMO_SPEC)],  # the resolver's own line first
    ["trace", "--spec", "absent.yaml"],
    ["trace", "--model", "test_vit"],  # no reference
    ["trace", "--data", "digits"],  # no model named: the resolver says so
    ["probe", "--model", "timm:test_vit"],  # no probe's command
])
def test_the_early_refusal_leaves_the_rest_to_the_command(argv):
    assert _missing_weights(["flatcheck", *argv]) is None


def test_the_early_refusal_reads_option_values_as_values():
    argv = ["trace", "--model", "timm:test_vit", "--set", "loss=mse", "--set", "kwargs.img_size=32",
            "--samples", "64", "--probes-max", "2", "--data=digits", "--layers", "-q"]
    assert _missing_weights(["flatcheck", *argv]) == NO_WEIGHTS


def test_every_probe_command_has_the_early_refusal():
    """Each probe's flags are read from its catalogue entry, options the command sets itself
    (no flag) included."""
    from flatcheck.probes.catalogue import current

    for name in current():
        assert _missing_weights(["flatcheck", name, "--model", "timm:test_vit", "--data", "digits"]) == NO_WEIGHTS, name


def test_imports_done_leaves_a_process_the_entry_point_did_not_start_alone():
    frozen, enabled = gc.get_freeze_count(), gc.isenabled()
    imports_done()
    assert (gc.get_freeze_count(), gc.isenabled()) == (frozen, enabled)


@pytest.mark.process
def test_the_command_runs_with_the_collector_on():
    """Off while the CLI and torch are imported, on again (with them frozen) before the products:
    a run's own cyclic garbage is collected as it goes."""
    argv = ["trace", str(DEMO), "--spec", str(DEMO_SPEC), "--data", "digits", "--samples", "64",
            "--probes-max", "2", "--no-layers", "-q"]
    code = ("import gc, sys\nseen = []\n"
            "gc.callbacks.append(lambda phase, info: seen.append('torch' in sys.modules) if phase == 'start' else None)\n"
            f"sys.argv = ['flatcheck', *{argv!r}]\nfrom flatcheck.entry import main\n"
            "try:\n    main()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
            "print('collections with torch loaded:', sum(seen), 'frozen:', gc.get_freeze_count())\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_GUARD,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    said = proc.stdout.strip().splitlines()[-1].split()
    assert int(said[4]) > 0 and int(said[6]) > 0, proc.stdout[-300:]
