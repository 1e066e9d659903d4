"""Multi30k, task 1 (Elliott et al., 2016): image captions in English with
German, French and Czech translations, raw (untokenized, cased) text.

| split | pairs | languages |
| --- | --- | --- |
| train | 29,000 | en de fr cs |
| val | 1,014 | en de fr cs |
| test_2016_flickr | 1,000 | en de fr cs |
| test_2017_flickr | 1,000 | en de fr |
| test_2017_mscoco | 461 | en de fr |

Terms: derived from Flickr30K, for non-commercial research and educational
use. Cite Elliott et al., "Multi30K: Multilingual English-German Image
Descriptions" (2016) when reporting results on it.

The files are read from a local directory (the `data_dir` argument, else the
`KERAS_TRANSFORMER_MULTI30K` environment variable), or else downloaded once
from the dataset's public repository into the Keras cache
(`~/.keras/datasets/multi30k`) and checked against their SHA-256 sums.
"""

import gzip
import os
import warnings
import zlib

import keras

from keras_transformer.utils.files import sha256

ENV_VAR = "KERAS_TRANSFORMER_MULTI30K"
VERIFY_ENV_VAR = "KERAS_TRANSFORMER_MULTI30K_VERIFY"
URL = "https://github.com/multi30k/dataset/raw/master/data/task1/raw/"

SPLITS = {
    "train": ("en", "de", "fr", "cs"),
    "val": ("en", "de", "fr", "cs"),
    "test_2016_flickr": ("en", "de", "fr", "cs"),
    "test_2017_flickr": ("en", "de", "fr"),
    "test_2017_mscoco": ("en", "de", "fr"),
}

SHA256 = {
    "test_2016_flickr.cs.gz": "200a4a74cc9560f051924abb9803be008d1908d77f747e9141aeb86dfd2797f1",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
    "test_2017_flickr.de.gz": "a2c89666db00c495cd8513b9d708d5a3acc205d7de312ef2bf5fb7ebc1540aee",
    "test_2017_flickr.en.gz": "76a444ee25172e72695cddb13ae4a3bda59430617be88e0bb46b60504f054074",
    "test_2017_flickr.fr.gz": "3ba671ceb2299f3304ffafefea7a833d08632fbaf0ba18546f8a2ec2391af496",
    "test_2017_mscoco.de.gz": "799e4854c25d601cb6cb6be29eabe5667734c61ace2f495e03e429031a0bc338",
    "test_2017_mscoco.en.gz": "aab300bfb4427697987e02cd0aacd44bfe8aa50456231b6474c08038bbed2b58",
    "test_2017_mscoco.fr.gz": "754f3072ba9f124569ba5258b32730fc1d214bbf8e0c6dfb2b74401676220db0",
    "train.cs.gz": "a65adb8b32e3bc664f21ecba7a6e7f6950fd1f405e135f7c312faabdb6255077",
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "val.cs.gz": "b63226e05c4bd5dd6a42897d74b86a1b9d2c31498252c572b1ea7f7996927fcc",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
}


def _check(split, language):
    if split not in SPLITS:
        raise ValueError(f"Unknown Multi30k split {split!r}; valid splits: {sorted(SPLITS)}.")
    if language not in SPLITS[split]:
        raise ValueError(
            f"Multi30k split {split!r} has no language {language!r}; "
            f"it has {list(SPLITS[split])}."
        )


def _path(split, language, data_dir):
    name = f"{split}.{language}.gz"
    data_dir = data_dir or os.environ.get(ENV_VAR)
    if data_dir:
        for candidate in (name, name[: -len(".gz")]):
            path = os.path.join(os.path.expanduser(data_dir), candidate)
            if os.path.exists(path):
                return path
        raise FileNotFoundError(
            f"Multi30k file {name} is not in {data_dir}. Pass the directory that "
            f"holds the task 1 raw files ({name}, ...), or leave `data_dir` and "
            f"${ENV_VAR} unset to download them."
        )
    try:
        return keras.utils.get_file(
            fname=name,
            origin=URL + name,
            file_hash=SHA256[name],
            hash_algorithm="sha256",
            cache_subdir=os.path.join("datasets", "multi30k"),
        )
    except Exception as error:  # get_file raises a bare Exception for network failures
        raise FileNotFoundError(
            f"Could not download Multi30k file {name} from {URL} ({error}). Without a network, pass "
            f"the directory that holds the task 1 raw files as `data_dir` (--data-dir) or set ${ENV_VAR}."
        ) from error


def read_lines(split, language, data_dir=None, verify=True):
    """The sentences of one split and language, one string per line.

    A local `.gz` file whose SHA-256 is not the published one's gives a
    warning (a deleted or added line would pair every later sentence with
    the wrong translation); `verify=False`, or
    `KERAS_TRANSFORMER_MULTI30K_VERIFY=0`, accepts changed files silently.
    """
    _check(split, language)
    path = _path(split, language, data_dir)
    if verify and os.environ.get(VERIFY_ENV_VAR, "1") != "0":
        _verify(path)
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            return [line.rstrip("\n") for line in f]
    except (EOFError, gzip.BadGzipFile, zlib.error, UnicodeDecodeError) as error:
        raise ValueError(
            f"The Multi30k file {path!r} is corrupt or truncated ({error}). Delete it and copy or "
            "download it again."
        ) from error


_verified = {}


def _verify(path):
    """Warns (once per file and version) if a local file is not the
    published one."""
    name = os.path.basename(path)
    if name not in SHA256:  # an uncompressed copy: no published sum
        return
    stat = os.stat(path)
    key = (os.path.abspath(path), stat.st_size, stat.st_mtime_ns)
    if key in _verified:
        return
    _verified[key] = found = sha256(path)
    if found != SHA256[name]:
        warnings.warn(
            f"The Multi30k file {path!r} differs from the published {name} (SHA-256 {found[:12]}..., expected "
            f"{SHA256[name][:12]}...). A line deleted, added or changed pairs every later sentence with the "
            "wrong translation: copy the file again. If you changed it on purpose, pass verify=False or set "
            f"{VERIFY_ENV_VAR}=0.",
            stacklevel=3,
        )


def load(split="train", source="en", target="de", data_dir=None, verify=True):
    """Source and target sentences of a Multi30k split.

    Args:
        split: one of `"train"`, `"val"`, `"test_2016_flickr"`,
            `"test_2017_flickr"`, `"test_2017_mscoco"`.
        source: source language, `"en"`, `"de"`, `"fr"` or `"cs"`.
        target: target language.
        data_dir: a directory with the raw files (`train.en.gz`...).
            Defaults to `$KERAS_TRANSFORMER_MULTI30K`, else a download into
            the Keras cache.
        verify: warn if a local file is not the published one (see
            `read_lines`).

    Returns:
        `(sources, targets)`: two lists of strings of the same length.

    Example:

    ```python
    sources, targets = multi30k.load("val", "en", "de", data_dir="multi30k/")
    sources[0]  # 'A group of men are loading cotton onto a truck'
    ```
    """
    if source == target:
        raise ValueError(f"source and target are both {source!r}; choose two languages.")
    sources = read_lines(split, source, data_dir, verify)
    targets = read_lines(split, target, data_dir, verify)
    if len(sources) != len(targets):
        raise ValueError(
            f"Multi30k {split}: {len(sources)} {source} lines but {len(targets)} {target} lines."
        )
    return sources, targets
