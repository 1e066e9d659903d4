import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tempfile  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

# The models (and the layers, decoding and presets they import) are
# imported before any module of the package is collected for its docstring
# examples. pytest's importlib mode runs a module file it collects; run
# before the package had imported it, a module ran twice (once more through
# the package's own imports), leaving two copies of its classes and state:
# `pytest keras_transformer/runtime/direct_calls.py tests/test_direct_calls.py`
# failed 8 tests on TensorFlow, the layers' `DirectCall` reading one
# `direct_calls()` state and the tests setting the other.
import keras_transformer.models  # noqa: E402, F401

if keras.config.backend() == "jax":
    import jax

    # Many tests build models of the same shapes (a run stopped and resumed,
    # a preset saved and loaded): XLA's persistent cache compiles each
    # function once per session instead of once per model, and once for
    # the test processes of a run that shares a cache directory
    # (tests/run_all_backends.sh).
    shared = os.environ.get("KERAS_TRANSFORMER_TEST_CACHE")
    if shared:
        os.makedirs(os.path.join(shared, "xla"), exist_ok=True)
    cache_dir = os.path.join(shared, "xla") if shared else tempfile.mkdtemp(prefix="xla-cache-")
    jax.config.update("jax_compilation_cache_dir", cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    # Commands that tests run in subprocesses keep theirs there too, not in
    # the user's cache (keras_transformer.utils.compile_cache).
    os.environ.setdefault("KERAS_TRANSFORMER_COMPILE_CACHE", cache_dir)


@pytest.fixture(autouse=True)
def _seed():
    keras.utils.set_random_seed(1234)
    np.random.seed(1234)


# A script that the distribution tests run in subprocesses, not a test module
# (--doctest-modules would import it).
collect_ignore = ["distributed_worker.py"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def multi30k_dir():
    """The local Multi30k copy: $KERAS_TRANSFORMER_MULTI30K, else
    ../shared/data/multi30k beside the repository."""
    path = os.environ.get("KERAS_TRANSFORMER_MULTI30K") or os.path.join(
        ROOT, "..", "shared", "data", "multi30k"
    )
    if not os.path.exists(os.path.join(path, "train.en.gz")):
        # A newcomer without the data runs the rest; `-ra` lists the skips.
        pytest.skip(
            f"Multi30k not found at {path}: set KERAS_TRANSFORMER_MULTI30K to a "
            "directory holding the raw task 1 files (train.en.gz, ...) to run this test."
        )
    return path


@pytest.fixture(scope="session")
def multi30k_train(multi30k_dir):
    from keras_transformer.datasets import multi30k

    return multi30k.load("train", "en", "de", data_dir=multi30k_dir)


@pytest.fixture
def small_tokenizer(multi30k_train):
    """A 1,000-token BPE vocabulary from 4,000 training pairs.

    Made anew for each test, after the seeding fixture: TensorFlow's
    set_seed clears the kernel cache that holds tensorflow-text's
    SentencePiece resource."""
    from keras_transformer.models import TransformerTokenizer

    sources, targets = multi30k_train
    return TransformerTokenizer.from_texts(sources[:4000] + targets[:4000], vocabulary_size=1000)
