"""The classes that a preset's config names, by the names they are
registered with Keras under (`keras_transformer>TransformerBackbone`, ...).

Keras reads a config by the registered name of each class in it; the
package's classes register themselves when their modules are imported
(`keras.saving.register_keras_serializable`). They sit above the presets,
which name none of them: the package lists the modules that hold them
(`keras_transformer.CLASS_MODULES`), imported here the first time a
config's classes are looked up, so that a command that checks a preset
before it loads a model knows them all the same.
"""

import importlib

import keras_transformer

# The registered names of this package's classes start with it.
PACKAGE_PREFIX = "keras_transformer>"


def registered_names():
    """The registered names of this package's classes."""
    import keras

    _import_class_modules()
    return {name for name in keras.saving.get_custom_objects() if name.startswith(PACKAGE_PREFIX)}


def config_class(config):
    """The class that a serialized object (such as a preset's
    `config.json`) names by its registered name."""
    import keras

    _import_class_modules()
    registered = config.get("registered_name")
    cls = keras.saving.get_registered_object(registered) if isinstance(registered, str) else None
    if cls is None:
        raise ValueError(
            f"Attempting to load class {registered} with `from_preset()`, but there is no class registered "
            f"with Keras for {registered}."
        )
    return cls


def _import_class_modules():
    for module in keras_transformer.CLASS_MODULES:
        importlib.import_module(module)
