"""The further models of an ensemble preset (`keras_transformer.presets.ensembles`),
loaded as tasks beside its first."""

import os

from keras_transformer.decoding.ensemble import Ensemble
from keras_transformer.presets.ensembles import member_locations
from keras_transformer.presets.layout import PresetError
from keras_transformer.presets.registry import resolve


def load_members(task, preset, load_weights=True, dtype=None):
    """The other models of an ensemble preset, as tasks of `task`'s class
    sharing `task`'s preprocessor; [] for a preset of one model."""
    members = []
    for path, location in member_locations(preset):
        backbone = type(task.backbone).from_preset(
            location, load_weights=load_weights, **({"dtype": dtype} if dtype is not None else {})
        )
        member = type(task)(backbone, preprocessor=task.preprocessor)
        try:
            Ensemble([task, member])
        except ValueError as error:
            raise PresetError(
                f"The preset {resolve(os.fspath(preset))!r} lists the ensemble model {path!r}, which does not "
                f"fit its first model ({path}/config.json): {error}"
            ) from error
        members.append(member)
    return members
