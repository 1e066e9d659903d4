"""The example that packages the shipped presets records what the run did."""

import argparse
import importlib.util
import json
import os

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def _load_example(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_packaging_records_the_steps_trained_and_checkpoints_averaged(tmp_path):
    presets_example = _load_example("multi30k_presets")
    # A run of 3 epochs of 10 steps, rerun afterwards with --epochs 1 (which
    # trained nothing): run.json asks for 1 epoch and keeps 5 checkpoints,
    # but 30 steps were trained and 3 checkpoints averaged.
    run = {"epochs": 1, "steps_per_epoch": 10, "keep_checkpoints": 5, "backend": "torch", "initial_step": 0}
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "metadata.json").write_text(
        json.dumps({"training": {"steps": 30, "averaged_checkpoints": 3}})
    )
    args = argparse.Namespace(pair="en-de", run_dir=str(tmp_path), hardware="test")
    record = presets_example.training_record(args, run)
    assert record["steps"] == 30 and record["averaged_checkpoints"] == 3
