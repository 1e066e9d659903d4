"""JAX's compiled decoding steps kept on disk between commands
(`keras_transformer.utils.compile_cache`)."""

import os
import subprocess
import sys

import keras
import pytest

from keras_transformer.utils import compile_cache

SENTENCE = "A man rides a bicycle down the street."


def _translate(cache):
    env = {**os.environ, compile_cache.ENVIRONMENT_VARIABLE: str(cache), "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run(
        [sys.executable, "-m", "keras_transformer.cli", "translate", "--beam-size", "2", SENTENCE],
        capture_output=True, text=True, env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_where_the_cache_goes(monkeypatch, tmp_path):
    monkeypatch.delenv(compile_cache.ENVIRONMENT_VARIABLE, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert compile_cache.default_directory() == os.path.join(str(tmp_path), "keras_transformer", "jax")
    monkeypatch.setenv(compile_cache.ENVIRONMENT_VARIABLE, str(tmp_path / "mine"))
    assert compile_cache.default_directory() == str(tmp_path / "mine")
    for off in ("off", "OFF", ""):
        monkeypatch.setenv(compile_cache.ENVIRONMENT_VARIABLE, off)
        assert compile_cache.default_directory() is None


@pytest.mark.skipif(keras.config.backend() == "jax", reason="JAX keeps a cache (the test below)")
def test_other_backends_keep_nothing(tmp_path):
    assert compile_cache.use_compile_cache(str(tmp_path / "cache")) is None
    assert not (tmp_path / "cache").exists()


@pytest.mark.skipif(keras.config.backend() != "jax", reason="only JAX's compiled code is kept")
def test_the_next_command_reads_the_compiled_steps_back(tmp_path):
    """The first command fills the directory; the second translates alike
    and adds no entry: every step it needed was read back, not compiled."""
    cache = tmp_path / "cache"
    first = _translate(cache)
    entries = sorted(os.listdir(cache))
    assert len(entries) > 3, entries  # the encoder and the search's steps
    assert _translate(cache) == first
    assert sorted(os.listdir(cache)) == entries
