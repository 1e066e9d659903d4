"""The parts of Keras' internals (`keras.src`) that this package uses
outside the backend wing's own modules, imported here, in one place, so
that a Keras release that moves them breaks one import.
"""

# Keras' own losses mark ignored positions by attaching a mask to the
# per-token losses, which `Loss.__call__` then averages over; the helper is
# not public API, so it is imported from where Keras' losses take it.
from keras.src.backend import set_keras_mask  # noqa: F401
