"""Equation (3) and the paper's Adam (section 5.3)."""

import keras
import numpy as np
import pytest

from keras_transformer.schedules import TransformerSchedule
from keras_transformer.schedules import paper_optimizer

from helpers import assert_config_round_trip


def equation_3(step_num, d_model, warmup_steps):
    return d_model**-0.5 * min(step_num**-0.5, step_num * warmup_steps**-1.5)


@pytest.mark.parametrize("d_model,warmup", [(512, 4000), (256, 100), (1024, 8000)])
def test_equals_equation_3_at_every_step(d_model, warmup):
    schedule = TransformerSchedule(d_model, warmup_steps=warmup)
    steps = np.arange(0, 3 * warmup, max(1, warmup // 97))
    got = np.array([float(schedule(step)) for step in steps])
    # Optimizer iteration i is the paper's step_num = i + 1.
    expected = np.array([equation_3(step + 1, d_model, warmup) for step in steps])
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    assert np.argmax(got) == np.searchsorted(steps, warmup - 1)


def test_scale_multiplies_the_rate():
    np.testing.assert_allclose(
        float(TransformerSchedule(512, 100, scale=2.0)(50)), 2 * equation_3(51, 512, 100), rtol=1e-6
    )


def test_serializable():
    schedule = TransformerSchedule(256, warmup_steps=123, scale=0.5)
    assert_config_round_trip(schedule)


def test_paper_optimizer_is_adam_0_9_0_98_1e_9_on_the_schedule():
    optimizer = paper_optimizer(d_model=512)
    assert isinstance(optimizer, keras.optimizers.Adam)
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.9, 0.98, 1e-9)
    assert isinstance(optimizer._learning_rate, TransformerSchedule)
    # The first update uses step_num = 1.
    np.testing.assert_allclose(float(optimizer.learning_rate), equation_3(1, 512, 4000), rtol=1e-5)
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert restored.get_config()["learning_rate"] == optimizer.get_config()["learning_rate"]


def test_invalid_arguments():
    with pytest.raises(ValueError, match="positive"):
        TransformerSchedule(512, warmup_steps=0)
    for scale in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="scale must be positive"):
            TransformerSchedule(512, scale=scale)
