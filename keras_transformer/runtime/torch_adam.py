"""Adam's update on PyTorch (`keras_transformer.schedules.Adam`): one fused
kernel on the CPU, where Keras runs each of about ten element-wise
operations as its own pass over every weight (see `schedules.Adam`).
"""

import torch

# Keras gives `keras.optimizers.Adam` itself, not a subclass, its PyTorch
# version (`torch._foreach_*` over all weights); it has no public name.
from keras.src.backend.torch.optimizers.torch_adam import Adam as TorchAdam


def adam_update(optimizer, grads, variables, learning_rate):
    """`optimizer`'s update of `variables` by `grads`: PyTorch's fused
    kernel where it applies (`fused_update`), else Keras' PyTorch update."""
    with torch.no_grad():
        if not fused_update(optimizer, grads, variables, learning_rate):
            TorchAdam._parallel_update_step(optimizer, grads, variables, learning_rate)


def fused_update(optimizer, grads, variables, learning_rate):
    """The update as `torch._fused_adam_`, where it applies: whether it
    did."""
    weights = [variable.value for variable in variables]
    if optimizer.amsgrad or not all(
        weight.device.type == "cpu" and grad.dtype == weight.dtype and grad.device == weight.device
        for weight, grad in zip(weights, grads)
    ):
        return False
    step = float(optimizer.iterations.value.item()) + 1.0
    # PyTorch's kernel adds epsilon to sqrt(v) / sqrt(1 - beta_2^t),
    # Keras to sqrt(v): epsilon / sqrt(1 - beta_2^t) here gives Keras'.
    epsilon = optimizer.epsilon / (1.0 - optimizer.beta_2**step) ** 0.5
    indices = [optimizer._get_variable_index(variable) for variable in variables]
    torch._fused_adam_(
        weights,
        list(grads),
        [optimizer._momentums[i].value for i in indices],
        [optimizer._velocities[i].value for i in indices],
        [],
        [torch.tensor(step)] * len(weights),
        lr=float(learning_rate),
        beta1=float(optimizer.beta_1),
        beta2=float(optimizer.beta_2),
        weight_decay=0.0,
        eps=epsilon,
        amsgrad=False,
        maximize=False,
    )
    # The kernel writes the weights in place without counting the
    # writes (`Tensor._version`), which PyTorch's own in-place calls
    # count: decoding's copies of weights (`direct_calls`) are made
    # again when a weight's count changes, and after training they
    # would otherwise go on reading the weights as they were.
    torch.autograd.graph.increment_version(weights)
    return True
