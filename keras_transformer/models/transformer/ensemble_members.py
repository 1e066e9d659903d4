"""The further models of an ensemble preset (`keras_transformer.presets.ensembles`),
loaded as tasks beside its first, kept by the task as its ensemble members
and saved with it."""

import os

from keras_transformer.decoding.ensemble import Ensemble
from keras_transformer.presets import ensembles
from keras_transformer.presets.ensembles import member_locations
from keras_transformer.presets.layout import ENSEMBLE_KEY
from keras_transformer.presets.layout import STORAGE_KEY
from keras_transformer.presets.layout import PresetError
from keras_transformer.presets.registry import preset_metadata
from keras_transformer.presets.registry import resolve
from keras_transformer.presets.saving import saving

# The entries of a preset's metadata.json that a model loaded from it
# writes into its own presets (`save_to_preset`): they stay true of the
# model after fine-tuning, unlike its scores or description.
INHERITED_METADATA = ("languages", "data_terms")


class EnsembleMembers:
    """A task's ensemble members: the other models of the ensemble preset
    it was loaded from, which its `generate` decodes with it, and its
    presets' metadata that stays true after fine-tuning.

    Mixed into the task class in front of `PresetIO`, whose `from_preset`
    and `save_to_preset` it extends.
    """

    @property
    def ensemble_members(self):
        """The other models of the ensemble preset this model was loaded
        from, which `generate` decodes with it by default ([] if none).

        They are kept apart from this model's layers and weights (`fit`
        trains this model alone); `save_to_preset` writes them with it.
        """
        return list(self.__dict__.get("_ensemble_members", ()))

    def set_ensemble_members(self, models):
        """Makes `models` (tasks on this model's vocabulary) the ensemble
        that `generate` and `save_to_preset` use; [] for this model alone.

        Example:

        ```python
        model = TransformerSeq2SeqLM.from_preset("runs/en-de-seed0/model")
        model.set_ensemble_members([TransformerSeq2SeqLM.from_preset("runs/en-de-seed1/model")])
        model.save_to_preset("en-de-ensemble")  # loads as the ensemble of both
        ```
        """
        models = list(models)
        nested = [i for i, model in enumerate(models) if getattr(model, "ensemble_members", None)]
        if nested:
            raise ValueError(
                f"Ensemble member {nested[0]} has ensemble members of its own; pass its models one by one: "
                "`[*others, member, *member.ensemble_members]`."
            )
        if models:
            Ensemble([self, *models])  # refuses models of another vocabulary
        # Set past Keras' and PyTorch's attribute tracking: the members'
        # weights are not this model's.
        object.__setattr__(self, "_ensemble_members", tuple(models))

    preset_keywords = ("load_ensemble",)

    @classmethod
    def from_preset(cls, preset, *args, load_ensemble=True, **kwargs):
        """Loads a preset (see `keras_transformer.presets`); of an ensemble
        preset, also its further models into `ensemble_members`, unless
        `load_ensemble=False` (its first model alone)."""
        model = super().from_preset(preset, *args, **kwargs)
        if isinstance(model, EnsembleMembers):
            # What the model keeps of its preset's metadata.json: its
            # languages (`Ensemble` refuses models of others) and the
            # data's terms, which a save of the model (fine-tuned) writes
            # again.
            metadata = preset_metadata(preset) if "://" not in os.fspath(preset) else {}
            object.__setattr__(
                model, "_preset_metadata", {key: metadata[key] for key in INHERITED_METADATA if key in metadata}
            )
        if isinstance(model, EnsembleMembers) and load_ensemble:
            model.set_ensemble_members(load_members(
                model, preset, load_weights=kwargs.get("load_weights", True), dtype=kwargs.get("dtype")
            ))
        return model

    def save_to_preset(self, preset_dir, *args, metadata=None, **kwargs):
        """Saves the model (and its `ensemble_members`) as a preset (see
        `PresetIO.save_to_preset`). A model loaded from a preset keeps its
        languages and its data's terms (`languages`, `data_terms` in
        metadata.json) in the presets it saves; `metadata` may replace them."""
        members = self.ensemble_members
        # The list of members and the weights' storage are the save's to
        # write (metadata copied from an ensemble preset must not list
        # members this save lacks).
        metadata = {
            key: value
            for key, value in {**getattr(self, "_preset_metadata", {}), **(metadata or {})}.items()
            if key not in (ENSEMBLE_KEY, STORAGE_KEY)
        } or None
        if not members:
            return super().save_to_preset(preset_dir, *args, metadata=metadata, **kwargs)
        # One save: the members are written into the same staging directory,
        # so a save that fails leaves the preset there as it was.
        listed = {**(metadata or {}), ENSEMBLE_KEY: ensembles.member_directories(len(members))}
        with saving(preset_dir, listed) as directory:
            super().save_to_preset(directory, *args, metadata=metadata, **kwargs)
            ensembles.save_members(members, directory, kwargs.get("weights_storage", "float"))


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
