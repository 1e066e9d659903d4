"""Keeping JAX's compiled decoding steps on disk, for the next process.

On JAX and TensorFlow each decoding step is compiled by XLA for each shape
it meets (batch slots, source length, cache length); a command that
translates a file compiles some 60 of them before its first line is out,
and the next command compiles them all again. JAX can keep what it compiles
in a directory and read it back when the same computation comes again: the
weights are inputs of the compiled steps, not constants, so one entry
serves every model of the same architecture.

`keras-transformer translate` and `evaluate` call `use_compile_cache()`.
`keras-transformer translate -i` of 256 test_2016_flickr lines (64 at a
time, beam 4, 2 CPU cores) took 35.3 s without it and 16.8 s with the
entries (120, 2.3 MB) of an earlier command; of that, translating once
everything is compiled takes about 2.3 s. TensorFlow's XLA cache
(`--tf_xla_persistent_cache_directory`) also works (45 against 24 s) but
takes ten times the disk and logs a warning for every entry it reads, so it
is left to those who set `TF_XLA_FLAGS` themselves.
"""

import os

# The environment variable that names the directory; "off" turns the cache off.
ENVIRONMENT_VARIABLE = "KERAS_TRANSFORMER_COMPILE_CACHE"


def default_directory():
    """`$KERAS_TRANSFORMER_COMPILE_CACHE`, else `$XDG_CACHE_HOME/keras_transformer/jax`
    (`~/.cache/keras_transformer/jax` by default); None when the variable is "off"."""
    chosen = os.environ.get(ENVIRONMENT_VARIABLE)
    if chosen is not None:
        return None if chosen.strip().lower() in ("off", "") else chosen
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "keras_transformer", "jax")


def use_compile_cache(directory=None):
    """Makes JAX keep compiled code in `directory` and read it from there.

    Does nothing on other backends, when the cache is turned off
    (`KERAS_TRANSFORMER_COMPILE_CACHE=off`), or when JAX already has a cache
    directory (set by the user: theirs is kept).

    Args:
        directory: where to keep it (created if missing); by default
            `default_directory()`.

    Returns:
        The directory JAX caches in, or None where nothing is cached.

    Example:

    >>> import keras
    >>> cached = use_compile_cache()
    >>> cached is None or keras.config.backend() == "jax"
    True
    """
    import keras

    if keras.config.backend() != "jax":
        return None
    import jax

    if jax.config.jax_compilation_cache_dir:
        return jax.config.jax_compilation_cache_dir
    directory = directory or default_directory()
    if directory is None:
        return None
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError:  # a read-only home, say: compile as without a cache
        return None
    jax.config.update("jax_compilation_cache_dir", directory)
    # A decoding step compiles in 0.1-0.5 s, under JAX's default threshold
    # (1 s) for what is worth keeping.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    # No size limit (JAX's default): its eviction needs the `filelock`
    # package and a lock shared by every process that writes there. Entries
    # are small (120 for a file of Multi30k sentences: 2.3 MB); the directory
    # can be deleted at any time.
    return directory
