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


def adam_reference(weights, gradients, rates, beta_1, beta_2, epsilon):
    """Adam's update (Kingma and Ba, algorithm 1, with Keras' placement of
    epsilon) in NumPy float64: the weights after each step's gradients."""
    weights = [w.astype("float64") for w in weights]
    m = [np.zeros_like(w) for w in weights]
    v = [np.zeros_like(w) for w in weights]
    for t, (step_gradients, rate) in enumerate(zip(gradients, rates), start=1):
        for i, g in enumerate(step_gradients):
            m[i] = beta_1 * m[i] + (1 - beta_1) * g
            v[i] = beta_2 * v[i] + (1 - beta_2) * g * g
            alpha = rate * np.sqrt(1 - beta_2**t) / (1 - beta_1**t)
            weights[i] = weights[i] - alpha * m[i] / (np.sqrt(v[i]) + epsilon)
    return weights


@pytest.mark.parametrize("epsilon", [1e-9, 1e-3])
def test_adam_updates_as_adam_and_as_keras_adam(epsilon):
    """The package's `Adam` (a fused kernel on PyTorch's CPU) against a NumPy Adam and Keras' own `Adam`, over 5 steps of
    the paper's schedule, for weights of several shapes. A large epsilon
    shows where it is added (PyTorch's kernel adds it elsewhere)."""
    from keras_transformer.schedules import Adam

    rng = np.random.default_rng(0)
    shapes = [(7, 5), (5,), (3, 4, 2)]
    initial = [rng.normal(size=shape).astype("float32") for shape in shapes]
    gradients = [[rng.normal(size=shape).astype("float32") * 10.0**-step for shape in shapes] for step in range(5)]
    results = {}
    for name, kind in (("package", Adam), ("keras", keras.optimizers.Adam)):
        variables = [keras.Variable(w) for w in initial]
        optimizer = kind(TransformerSchedule(64, warmup_steps=3), beta_1=0.9, beta_2=0.98, epsilon=epsilon)
        for step_gradients in gradients:
            optimizer.apply([keras.ops.convert_to_tensor(g) for g in step_gradients], variables)
        results[name] = [keras.ops.convert_to_numpy(v) for v in variables]
        assert int(keras.ops.convert_to_numpy(optimizer.iterations)) == 5
    rates = [equation_3(step, 64, 3) for step in range(1, 6)]
    expected = adam_reference(initial, gradients, rates, 0.9, 0.98, epsilon)
    for got, keras_got, want, start in zip(results["package"], results["keras"], expected, initial):
        assert np.abs(want - start).max() > 1e-3  # the weights moved
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got, keras_got, rtol=1e-5, atol=1e-6)


def test_adam_trains_in_model_fit_and_restores_from_its_config():
    """`Adam` in `model.fit`, and
    its config, schedule included, round-trips."""
    from keras_transformer.schedules import Adam

    rng = np.random.default_rng(1)
    x = rng.normal(size=(64, 3)).astype("float32")
    y = x @ np.array([[1.0], [-2.0], [0.5]], "float32")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=paper_optimizer(d_model=4, warmup_steps=10, scale=5.0), loss="mse")
    before = model.evaluate(x, y, verbose=0)
    model.fit(x, y, epochs=20, batch_size=16, verbose=0)
    assert model.evaluate(x, y, verbose=0) < before / 4
    assert isinstance(model.optimizer, Adam)
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(model.optimizer))
    assert isinstance(restored, Adam) and restored.get_config() == model.optimizer.get_config()
