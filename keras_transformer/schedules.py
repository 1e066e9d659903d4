"""The optimizer and learning-rate schedule of paper section 5.3.

    lrate = d_model^-0.5 * min(step_num^-0.5, step_num * warmup_steps^-1.5)   (3)

with Adam(beta_1=0.9, beta_2=0.98, epsilon=1e-9).
"""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Equation (3): linear warm-up, then inverse square-root decay.

    The optimizer's step counter starts at 0; the paper's `step_num` starts
    at 1, so the rate for optimizer iteration `i` is equation (3) at
    `step_num = i + 1` (and never the 0 that `step_num = 0` would give).

    Args:
        d_model: model width; the peak rate scales with d_model^-0.5.
        warmup_steps: steps of linear warm-up (the paper: 4000).
        scale: a factor on the whole rate (the paper: 1.0; tensor2tensor
            calls it `learning_rate` and often uses 2.0).

    Example:

    >>> schedule = TransformerSchedule(d_model=512, warmup_steps=4000)
    >>> round(float(schedule(3999)), 7)  # the peak, at step_num 4000
    0.0006988
    """

    def __init__(self, d_model, warmup_steps=4000, scale=1.0):
        if d_model <= 0 or warmup_steps <= 0:
            raise ValueError(
                f"d_model and warmup_steps must be positive, got d_model={d_model}, "
                f"warmup_steps={warmup_steps}."
            )
        if not scale > 0:
            raise ValueError(f"scale must be positive (a factor on the learning rate), got {scale}.")
        self.d_model = int(d_model)
        self.warmup_steps = int(warmup_steps)
        self.scale = float(scale)

    def __call__(self, step):
        step_num = ops.cast(step, "float32") + 1.0
        rate = ops.minimum(ops.rsqrt(step_num), step_num * self.warmup_steps**-1.5)
        return self.scale * self.d_model**-0.5 * rate

    def get_config(self):
        return {"d_model": self.d_model, "warmup_steps": self.warmup_steps, "scale": self.scale}


def paper_optimizer(d_model, warmup_steps=4000, scale=1.0, **kwargs):
    """Adam(beta_1=0.9, beta_2=0.98, epsilon=1e-9) on `TransformerSchedule`.

    Args:
        d_model: model width.
        warmup_steps: steps of linear warm-up.
        scale: factor on the learning rate.
        **kwargs: further `keras.optimizers.Adam` arguments (`clipnorm`...).

    Example:

    >>> optimizer = paper_optimizer(d_model=512)
    >>> optimizer.beta_2
    0.98
    """
    return keras.optimizers.Adam(
        learning_rate=TransformerSchedule(d_model, warmup_steps, scale),
        beta_1=0.9,
        beta_2=0.98,
        epsilon=1e-9,
        **kwargs,
    )
