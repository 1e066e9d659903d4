"""One output line per input line whatever ends the lines, blank (or
invisible) lines translated as empty, and clear errors instead of
tracebacks: a closed standard input or output, Ctrl-C during `translate`
(exit 130, `--output` whole or untouched), JSON files of the wrong type, hub
handles without a network, an unknown `KERAS_BACKEND`, a `task.json` that
disagrees with `config.json`, and `train` arguments refused before anything
is written, lock included."""

import json
import os
import pty
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from keras_transformer import cli
from keras_transformer import cli_io
from keras_transformer.models import TransformerSeq2SeqLM
from keras_transformer.presets import PresetError
from keras_transformer.presets import hub
from keras_transformer.utils.text import is_blank
from keras_transformer.utils.text import split_lines

from helpers import once
from tiny_preset import save_tiny_preset

# Lines that show nothing: a zero-width space, a byte order mark, a soft
# hyphen, a word joiner, and a mix of them with whitespace.
INVISIBLE = ["\u200b", "\ufeff", "\u00ad", "\u2060", " \u200b\t\u00ad "]
RUN = [sys.executable, "-c", "from keras_transformer.cli import run; run()"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """`(model, preset directory)`."""
    directory = str(tmp_path_factory.mktemp("tiny") / "preset")
    return save_tiny_preset(directory), directory


def _translate(directory, *options):
    return ["translate", "--preset", directory, "--beam-size", "1", *options]


def _copy(directory, tmp_path):
    return shutil.copytree(directory, tmp_path / "copy")


# --- Lines ---


def test_lines_end_at_newline_crlf_and_cr_alone():
    assert split_lines("a\nb\r\nc\rd") == ["a", "b", "c", "d"]
    assert split_lines("a\r\rb\r\n\r\n") == ["a", "", "b", ""]
    assert split_lines("a\u2028b\fc\x85d\n") == ["a\u2028b\fc\x85d"]  # separators inside a sentence stay
    assert cli_io.decode_lines(b"\xef\xbb\xbfa\rb\r\nc", "f") == ["a", "b", "c"]
    with pytest.raises(ValueError, match="line 3 of f is not valid UTF-8"):
        cli_io.decode_lines(b"a\rb\rc \xff\n", "f")


@once  # (the command's reading of lines: the same on every backend)
def test_translate_gives_one_line_per_input_line_whatever_ends_them(tiny, tmp_path, capsys):
    model, directory = tiny
    lines = ["A dog runs.", "Two men play.", "", "A girl sings.", "The cat sleeps."]
    mixed = tmp_path / "mixed.txt"
    mixed.write_bytes("A dog runs.\rTwo men play.\r\n\nA girl sings.\rThe cat sleeps.".encode())
    cli.main(_translate(directory, "-i", str(mixed)))
    out = capsys.readouterr().out
    assert out.count("\n") == len(lines)
    assert out.split("\n")[:-1] == model.generate(lines, sampler="greedy")
    with pytest.raises(SystemExit):
        cli.main(["translate", "--help"])
    assert "\\r\\n or \\r" in " ".join(capsys.readouterr().out.split())


@once  # (blank sources never reach the search: the same on every backend)
def test_invisible_lines_are_translated_as_blank_ones(tiny, tmp_path, capsys):
    model, directory = tiny
    assert all(is_blank(text) for text in INVISIBLE) and not is_blank("\u200bA dog.")
    assert model.generate(INVISIBLE, sampler="greedy") == [""] * len(INVISIBLE)
    assert model.generate(INVISIBLE + ["A dog."], return_scores=True)[0] == [("", 0.0)]
    with pytest.raises(ValueError, match="target_prefix is blank"):
        model.generate(["A dog."], target_prefix="\u200b\u00ad")
    source = tmp_path / "invisible.txt"
    source.write_text("A dog runs.\n" + "\n".join(INVISIBLE) + "\n", encoding="utf-8")
    cli.main(_translate(directory, "-i", str(source)))
    out = capsys.readouterr().out.split("\n")[:-1]
    assert out[1:] == [""] * len(INVISIBLE) and len(out) == 1 + len(INVISIBLE)


# --- Standard input and output, Ctrl-C ---


def test_closed_standard_input_or_output_is_said(tiny, monkeypatch):
    _, directory = tiny
    monkeypatch.setattr(sys, "stdin", None)  # what Python makes of `<&-`
    with pytest.raises(SystemExit, match="error: no sentences to translate: standard input is closed"):
        cli.main(_translate(directory))
    monkeypatch.setattr(sys, "stdout", None)  # `>&-`
    with pytest.raises(SystemExit, match="error: standard output is closed: write the translations to a file"):
        cli.main(_translate(directory, "A dog."))


@once  # (the command's writing of files: the same on every backend)
def test_an_output_file_is_written_whole_or_left_as_it_was(tiny, tmp_path, monkeypatch, capsys):
    _, directory = tiny
    output = tmp_path / "out.txt"
    output.write_text("earlier translations\n")
    os.chmod(output, 0o640)

    def interrupted(*args):
        raise KeyboardInterrupt  # Ctrl-C at the last moment

    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", interrupted)
        with pytest.raises(KeyboardInterrupt):
            cli.main(_translate(directory, "-o", str(output), "A dog.", "A cat."))
    assert output.read_text() == "earlier translations\n" and os.listdir(tmp_path) == ["out.txt"]
    cli.main(_translate(directory, "-o", str(output), "A dog.", "A cat."))
    assert output.read_text().count("\n") == 2 and os.listdir(tmp_path) == ["out.txt"]
    assert os.stat(output).st_mode & 0o777 == 0o640  # its permissions kept
    cli.main(_translate(directory, "-o", os.devnull, "A dog."))  # not a file: written in place


def test_ctrl_c_during_translate_exits_130_with_one_line(tiny, tmp_path):
    _, directory = tiny
    output = tmp_path / "out.txt"
    output.write_text("earlier translations\n")
    terminal, terminal_end = pty.openpty()  # a terminal: translate says when it waits for input
    process = subprocess.Popen([*RUN, *_translate(directory, "-o", str(output))], stdin=terminal_end,
                               stderr=subprocess.PIPE, text=True)
    os.close(terminal_end)
    before = []  # what the process wrote before its prompt (a backend's log lines, if any)
    try:
        for line in iter(process.stderr.readline, ""):  # the prompt: printed as it starts to read
            if line == "Type sentences, one a line; end with Ctrl-D.\n":
                break
            before.append(line)
        os.write(terminal, b"A dog runs.\n")
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
        os.close(terminal)
    assert not any(line.startswith("Traceback") for line in before), "".join(before) + stderr
    assert (process.returncode, stderr) == (130, "interrupted\n"), "".join(before) + stderr
    assert output.read_text() == "earlier translations\n" and os.listdir(tmp_path) == ["out.txt"]


# --- Files of the wrong type ---


def test_json_files_of_the_wrong_type_are_named(tiny, tmp_path):
    _, directory = tiny
    copy = _copy(directory, tmp_path)
    (copy / "metadata.json").write_text("[1, 2]")
    with pytest.raises(PresetError, match="metadata.json' holds a JSON list, not the object"):
        TransformerSeq2SeqLM.from_preset(str(copy))
    with pytest.raises(SystemExit, match="error: The preset file .*metadata.json' holds a JSON list"):
        cli.main(_translate(str(copy), "A dog."))
    run = tmp_path / "run"
    shutil.copytree(directory, run / "model")
    (run / "run.json").write_text('"en-de"')
    with pytest.raises(SystemExit, match="error: The training run's record .*run.json' holds a JSON string.*--source"):
        cli.main(["evaluate", str(run / "model")])


def test_a_task_json_that_disagrees_with_config_json_is_named(tiny, tmp_path):
    _, directory = tiny
    copy = _copy(directory, tmp_path)
    task = json.loads((copy / "task.json").read_text())
    task["config"]["backbone"]["config"]["max_sequence_length"] = 8
    (copy / "task.json").write_text(json.dumps(task))
    with pytest.raises(SystemExit) as raised:  # not "a source of N tokens is longer than 8"
        cli.main(_translate(str(copy), "A man rides a bicycle down the street with two dogs."))
    assert "in task.json and in config.json, and they differ: max_sequence_length is 8 in task.json but 32" in str(
        raised.value)
    shutil.copy(os.path.join(directory, "task.json"), copy / "task.json")
    config = json.loads((copy / "config.json").read_text())
    config["config"]["num_layers"] = 2  # an edit translate would not read
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(PresetError, match="num_layers is 1 in task.json but 2 in config.json"):
        TransformerSeq2SeqLM.from_preset(str(copy))


# --- Hub handles without a network ---


@pytest.fixture
def no_network(monkeypatch):
    """The hubs cannot be reached (a connection is refused), whatever the
    machine's network."""
    import huggingface_hub.constants

    def refuse(address, *args, **kwargs):
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(hub, "_probed", {})
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # (restored after: the check sets it)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)


def test_hub_handles_without_a_network_fail_at_once_and_say_what_to_do(no_network):
    start = time.monotonic()
    with pytest.raises(PresetError) as raised:
        TransformerSeq2SeqLM.from_preset("hf://keras-transformer-tests/no-such-model")
    message = str(raised.value)
    assert "huggingface.co: Connection refused" in message and "huggingface-cli download" in message
    assert "--preset DIR" in message
    with pytest.raises(PresetError) as raised:
        TransformerSeq2SeqLM.from_preset("kaggle://keras-transformer-tests/none/keras/none")
    message = str(raised.value)
    assert "Kaggle cannot be reached (api.kaggle.com: Connection refused)" in message
    assert "kagglehub.model_download('keras-transformer-tests/none/keras/none')" in message
    assert time.monotonic() - start < 10  # not huggingface_hub's 30 s of retries


# --- The environment ---


def test_an_unknown_keras_backend_lists_the_backends():
    result = subprocess.run([*RUN, "translate", "A dog."], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "KERAS_BACKEND": "pytorch"})
    assert result.returncode == 1
    assert result.stderr == (
        "error: KERAS_BACKEND='pytorch' is not a Keras backend: set it to jax, tensorflow or torch (did you "
        "mean 'torch'?) to choose one, or unset it for Keras's default.\n"
    )


# --- train checks its arguments before it writes ---


def test_train_refuses_heads_that_do_not_divide_d_model_leaving_nothing(tmp_path):
    with pytest.raises(SystemExit, match="error: d_model=256 is not divisible by num_heads=3"):
        cli.main(["train", "--output-dir", str(tmp_path / "run"), "--num-heads", "3"])
    assert os.listdir(tmp_path) == []  # not even the lock's files
