"""One writer a directory: every command that writes a directory takes its
lock (`keras_transformer.utils.locks`), a second writer gets an error that
names the holder's process id and changes nothing of the holder's, and a
lock left by a killed process never blocks. The holders here are other
processes that hold a directory's lock as the commands do, the second
writers the commands themselves; and two real `train` runs race for one
directory."""

import os
import signal
import subprocess
import sys

import pytest

from keras_transformer import cli
from keras_transformer.utils import locks
from keras_transformer.utils.locks import DirectoryInUseError

from helpers import directory_contents
from helpers import once
from tiny_preset import save_tiny_preset


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """`(model, preset directory, Marian directory)`."""
    from keras_transformer.convert import export_marian

    root = tmp_path_factory.mktemp("tiny")
    model = save_tiny_preset(str(root / "preset"))
    return model, str(root / "preset"), export_marian(model, str(root / "marian"))


def _holder(directory, purpose):
    """Another process that holds `directory`'s lock until it is killed;
    returns it once it holds it."""
    code = (
        "import sys, time\n"
        "from keras_transformer.utils import locks\n"
        f"with locks.locked({str(directory)!r}, {purpose!r}):\n"
        "    print('holding', flush=True)\n"
        "    time.sleep(300)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "holding\n"
    return process


@pytest.fixture
def held(tmp_path):
    """A directory with files (the holder's work so far), locked by another
    process: `(directory, process)`."""
    directory = tmp_path / "out"
    (directory / "variables").mkdir(parents=True)
    (directory / "saved_model.pb").write_bytes(b"the holder's export")
    process = _holder(directory, "export")
    yield directory, process
    process.kill()
    process.wait()


def test_every_writer_refuses_a_directory_another_process_writes(tiny, held, capsys):
    model, preset, marian = tiny
    directory, holder = held
    before = directory_contents(directory)
    commands = [
        ["train", "--output-dir", str(directory), "--epochs", "1"],
        ["export", "--preset", preset, "--overwrite", str(directory)],
        ["export-transformers", "--preset", preset, "--overwrite", str(directory)],
        ["convert", marian, "--overwrite", str(directory)],
    ]
    for command in commands:
        with pytest.raises(SystemExit) as raised:
            cli.main(command)
        message = str(raised.value)
        assert message.startswith("error: ") and f"is being written by process {holder.pid} (export)" in message
        assert "Wait for it to finish" in message and len(message.splitlines()) == 1
    with pytest.raises(DirectoryInUseError, match=f"process {holder.pid} "):
        model.save_to_preset(str(directory))
    assert directory_contents(directory) == before  # nothing of the holder's changed
    assert sorted(os.listdir(directory.parent)) == [".out.lock", ".out.lock.pid", "out"]  # nothing left beside


def test_a_lock_left_by_a_killed_writer_never_blocks(tiny, held):
    model, preset, _ = tiny
    directory, holder = held
    assert locks.holder(directory)["pid"] == holder.pid
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert locks.holder(directory) is None  # its record is left, but no process holds the lock
    target = directory.parent / "saved"
    killed = _holder(target, "train")
    killed.kill()
    killed.wait()
    model.save_to_preset(str(target))  # takes the lock the killed process held
    assert os.path.isfile(target / "config.json")
    assert not os.path.exists(str(target.parent / ".saved.lock.pid"))  # a holder's record goes with it
    assert os.path.exists(str(target.parent / ".saved.lock")) != locks.REMOVES_LOCK_FILE


def test_a_writer_takes_its_own_lock_again_but_no_other_thread_does(tmp_path):
    import threading

    found = []
    with locks.locked(tmp_path / "out", "convert"):
        with locks.locked(tmp_path / "out", "save_to_preset"):  # as convert's save does
            assert locks.holder(tmp_path / "out")["purpose"] == "convert"

        def other_thread():
            try:
                with locks.locked(tmp_path / "out"):
                    found.append("acquired")
            except DirectoryInUseError as error:
                found.append(str(error))

        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
    assert f"is being written by process {os.getpid()} (convert)" in found[0]
    with locks.locked(tmp_path / "out"):  # released
        pass


def test_convert_into_a_free_directory_still_works(tiny, tmp_path):
    _, _, marian = tiny
    cli.main(["convert", marian, str(tmp_path / "converted")])
    assert os.path.isfile(tmp_path / "converted" / "config.json")
    assert locks.holder(tmp_path / "converted") is None


@once
def test_two_train_runs_started_together_leave_one_whole_run(tmp_path, multi30k_dir):
    """Two real `train` processes with the same settings and one
    `--output-dir`, started together: one trains and saves its model, the
    other stops at once with the winner's process id, and the run
    directory holds the winner's run alone (one history line an epoch)."""
    run = tmp_path / "run"
    command = [sys.executable, "-m", "keras_transformer.cli", "train", "--output-dir", str(run),
               "--data-dir", multi30k_dir, "--config", "tiny", "--vocabulary-size", "400", "--max-tokens", "512",
               "--pad-to-multiple-of", "96", "--epochs", "2", "--warmup-steps", "10", "--bleu-sentences", "0",
               "--limit", "100"]
    environment = {**os.environ, "KERAS_BACKEND": "torch"}
    processes = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=environment) for _ in range(2)]
    results = [(process.pid, process.wait(600), process.stderr.read()) for process in processes]
    for process in processes:
        process.stdout.close()
        process.stderr.close()
    (winner, _, _), = [result for result in results if result[1] == 0]
    (loser, status, error), = [result for result in results if result[1] != 0]
    assert status == 1 and f"is being written by process {winner} (train)" in error, error
    assert os.path.isdir(run / "model")
    with open(run / "history.csv") as f:
        epochs = [line.split(",")[0] for line in f.read().splitlines()[1:]]
    assert epochs == ["0", "1"]
