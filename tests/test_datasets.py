"""The Multi30k loader (local copy only: tests never download)."""

import os
import shutil

import pytest

from keras_transformer.datasets import multi30k
from keras_transformer.utils.files import sha256


def test_loads_aligned_pairs(multi30k_dir):
    sources, targets = multi30k.load("val", "en", "de", data_dir=multi30k_dir)
    assert len(sources) == len(targets) == 1014
    assert sources[0].startswith("A group of men")
    assert all(isinstance(s, str) and s for s in sources + targets)
    assert not any(s.endswith("\n") for s in sources)


@pytest.mark.parametrize("split,count", [("train", 29000), ("test_2016_flickr", 1000), ("test_2017_mscoco", 461)])
def test_split_sizes(multi30k_dir, split, count):
    sources, targets = multi30k.load(split, "en", "fr", data_dir=multi30k_dir)
    assert len(sources) == len(targets) == count


def test_environment_variable(multi30k_dir, monkeypatch):
    monkeypatch.setenv(multi30k.ENV_VAR, multi30k_dir)
    assert len(multi30k.load("val", "de", "en")[0]) == 1014


def test_unknown_split_and_language_list_the_valid_ones(multi30k_dir):
    with pytest.raises(ValueError, match="valid splits.*test_2016_flickr"):
        multi30k.load("test", "en", "de", data_dir=multi30k_dir)
    with pytest.raises(ValueError, match=r"has no language 'cs'.*\['en', 'de', 'fr'\]"):
        multi30k.load("test_2017_flickr", "en", "cs", data_dir=multi30k_dir)
    with pytest.raises(ValueError, match="two languages"):
        multi30k.load("val", "en", "en", data_dir=multi30k_dir)


def test_missing_file_is_named(tmp_path, multi30k_dir):
    shutil.copy(os.path.join(multi30k_dir, "val.en.gz"), tmp_path)
    with pytest.raises(FileNotFoundError, match="val.de.gz"):
        multi30k.load("val", "en", "de", data_dir=str(tmp_path))


def test_checksums_match_the_local_copy(multi30k_dir):
    for name, digest in multi30k.SHA256.items():
        assert sha256(os.path.join(multi30k_dir, name)) == digest, name


def test_a_failed_download_says_how_to_work_offline(monkeypatch, capsys):
    from keras_transformer import cli

    def offline(*args, **kwargs):
        raise Exception("URL fetch failure: Name or service not known")

    monkeypatch.delenv(multi30k.ENV_VAR, raising=False)
    monkeypatch.setattr(multi30k.keras.utils, "get_file", offline)
    with pytest.raises(FileNotFoundError, match="Could not download Multi30k file val.en.gz .*Name or service"):
        multi30k.load("val", "en", "de")
    # The command line prints the message, not a traceback.
    with pytest.raises(SystemExit, match=r"error: Could not download .* \(--data-dir\)"):
        cli.main(["evaluate", "transformer_multi30k_en_de", "--split", "val", "--limit", "1"])


def test_a_truncated_file_is_named(tmp_path, multi30k_dir):
    import gzip
    import shutil

    from keras_transformer.datasets import multi30k

    for name in os.listdir(multi30k_dir):
        if os.path.isfile(os.path.join(multi30k_dir, name)):
            shutil.copy(os.path.join(multi30k_dir, name), tmp_path / name)
    path = multi30k._path("val", "en", str(tmp_path))
    data = open(path, "rb").read()
    if not path.endswith(".gz"):
        data = gzip.compress(data)
    open(path, "wb").write(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"val\.en.* is corrupt or truncated"):
        multi30k.load("val", "en", "de", data_dir=str(tmp_path))
