"""A decoder or encoder layer's weights as the PyTorch products and norms
that `runtime.torch_decoding_step` calls: made once, held on the layer,
and made again when a weight is replaced or written.
"""

from keras.dtype_policies import DTypePolicyMap

from keras_transformer.runtime.layer_calls import torch_call_of
from keras_transformer.runtime.direct_calls import unchanged_scope
from keras_transformer.runtime.int8_products import exact_float_kernel
from keras_transformer.runtime.int8_products import int8_product
from keras_transformer.runtime.int8_products import prepacked_product


class StepWeights:
    """A decoder layer's weights, as the products and norms `decoding_step`
    calls.

    Held on the layer and made again when a weight is replaced or written
    (PyTorch counts a tensor's in-place writes): the products read views of
    the weights, except the self-attention's joined projection, a copy, and
    prepacked weights (`int8_products.prepacked_product`).
    """

    def __init__(self, layer):
        import torch

        attention, feed_forward = layer.self_attention, layer.feed_forward
        cross = getattr(layer, "cross_attention", None)  # None: an encoder layer
        with torch.no_grad():
            joined = [attention.query_dense, attention.key_dense, attention.value_dense]
            self.sizes = [dense._kernel_matrix().shape[1] for dense in joined]
            self.self_projection = _joined_product(joined)
            self.self_output = _product(attention.output_dense)
            if cross is not None:
                self.cross_query = _product(cross.query_dense)
                self.cross_output = _product(cross.output_dense)
                # The encoder output's keys and values, once a source (`cross_attention_cache`).
                memory = [cross.key_dense, cross.value_dense]
                self.cross_sizes = [dense._kernel_matrix().shape[1] for dense in memory]
                self.cross_key_value = _joined_product(memory)
            self.inner = _product(feed_forward.inner_dense)
            self.outer = _product(feed_forward.output_dense)
            self.norms = [(norm.gamma.value, norm.beta.value, norm.epsilon) for norm in norms_of(layer)]
        self.inner_dense = feed_forward.inner_dense  # its activation
        self.num_heads = attention.num_heads
        self.cross_heads = None if cross is None else cross.num_heads
        self.normalize_first = layer.normalize_first


def _product(dense):
    """`x -> x @ kernel + bias` of a dense layer (`Dense`, or an
    `EinsumDense` that `direct_calls` reduces to a matrix product), for `x`
    of `(..., inputs)`: one `torch.nn.functional.linear` call for float
    weights (a `prepacked_product` for bfloat16 ones, and large float32
    ones on AMD processors, where it applies), Keras' int8 product for int8
    ones."""
    return _joined_product([dense])


def _joined_product(denses):
    """`_product` of dense layers that read the same inputs, their outputs
    side by side; the layers are all float or all int8 (else each is its
    own product)."""
    import torch
    from torch.nn.functional import linear

    modes = {dense.quantization_mode for dense in denses}
    if len(modes) > 1:
        products = [_product(dense) for dense in denses]
        return lambda x: torch.cat([product(x) for product in products], dim=-1)
    bias = _joined_bias(denses)
    matrices = [dense._kernel_matrix() for dense in denses]
    # One matrix: a view of the kernel; several: a copy side by side.
    kernel = matrices[0] if len(matrices) == 1 else torch.cat(matrices, dim=1)
    if modes == {None}:
        weight = kernel.t()
        packed = prepacked_product(weight)
        if packed is not None:
            return lambda x: packed(x, bias)
        return lambda x: linear(x, weight, bias)
    scale = torch.cat([dense._int8_kernel_scale().reshape(-1) for dense in denses])
    quantizer = denses[0].inputs_quantizer
    float_kernel = exact_float_kernel(kernel)  # (small kernels: for exact products of a few rows)

    def product(x):
        outputs = int8_product(quantizer, x, 1, kernel, scale, x.dtype, float_kernel=float_kernel)
        return outputs if bias is None else outputs + bias

    return product


def _joined_bias(denses):
    """The biases of projections side by side, or None: an attention's
    projections have biases or not all alike (its `use_bias`)."""
    import torch

    if denses[0].bias is None:
        return None
    return torch.cat([dense.bias.value.flatten() for dense in denses])


def step_weights(layer):
    """`layer`'s `StepWeights`, current with its weights; None where a
    sub-layer has no plain PyTorch call (LoRA, quantized other than to
    int8, or a structure `direct_calls` does not reduce to a product).

    What it checks is kept short (a step of one sentence's beams takes
    well under a millisecond a layer): that no sub-layer's dtype policy was
    replaced (quantization replaces it) or LoRA enabled, and that no weight
    was replaced or written to since the matrices were made; within
    `direct_calls.unchanged_weights()` (a search), once.
    """
    held = layer.__dict__.get("_torch_step_weights")
    scope = unchanged_scope()
    if held is not None:
        sublayers, variables, weights, checked_in = held
        if scope is not None and checked_in is scope:
            return weights
        plain = all(_still_plain(sublayer, policy) for sublayer, policy in sublayers)
        if plain and all(v._value is value and value._version == count for v, value, count in variables):
            held[3] = scope
            return weights
    sublayers = _sublayers(layer)
    if any(
        sublayer.quantization_mode not in (None, "int8") or torch_call_of(sublayer) is None for sublayer in sublayers
    ):
        return None
    weights = StepWeights(layer)
    variables = [(v, v._value, v._value._version) for sublayer in sublayers for v in sublayer.weights]
    # Tracked attributes would be saved: set it past Keras' tracker.
    object.__setattr__(
        layer, "_torch_step_weights",
        [[(sublayer, sublayer._dtype_policy) for sublayer in sublayers], variables, weights, scope],
    )
    return weights


def _sublayers(layer):
    """The projections and LayerNorms of a decoder or encoder layer."""
    attention, cross, feed_forward = layer.self_attention, getattr(layer, "cross_attention", None), layer.feed_forward
    crossing = () if cross is None else (cross.query_dense, cross.key_dense, cross.value_dense, cross.output_dense)
    return (
        attention.query_dense, attention.key_dense, attention.value_dense, attention.output_dense,
        *crossing, feed_forward.inner_dense, feed_forward.output_dense, *norms_of(layer),
    )


def norms_of(layer):
    """A decoder or encoder layer's LayerNorms, in the order of their
    sub-layers."""
    cross = getattr(layer, "cross_attention_norm", None)
    return (layer.self_attention_norm, *(() if cross is None else (cross,)), layer.feed_forward_norm)


def _still_plain(sublayer, policy):
    """Whether a sub-layer is still neither quantized nor with LoRA, checked
    fast: quantizing a layer replaces its dtype policy, unless the policy is
    a `DTypePolicyMap` (one object for every layer), where the layer's
    `quantization_mode` is read."""
    if getattr(sublayer, "lora_enabled", False):
        return False
    current = sublayer._dtype_policy
    if current is policy and not isinstance(current, DTypePolicyMap):
        return True
    return sublayer.quantization_mode is None
