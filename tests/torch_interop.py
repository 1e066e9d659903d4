"""Copy the weights of a PyTorch `torch.nn.Transformer` into a
`TransformerBackbone`.

`torch.nn.Transformer` has no embeddings: it maps embedded source and target
sequences to decoder states. Its encoder and decoder stacks correspond layer
by layer to the backbone's, which makes it an independent reference for the
stacks (the tests compare both on the same weights). The mapping:

| torch | keras_transformer |
| --- | --- |
| `self_attn.in_proj_weight[:E]` (out, in) | `self_attention.query_dense.kernel` (in, h, d_k) |
| `self_attn.in_proj_weight[E:2E]`, `[2E:]` | `key_dense`, `value_dense` kernels |
| `self_attn.out_proj.weight` (out, in) | `self_attention.output_dense.kernel` (h, d_v, out) |
| `multihead_attn` | `cross_attention` |
| `linear1`, `linear2` | `feed_forward.inner_dense`, `feed_forward.output_dense` |
| `norm1`, `norm2`, `norm3` | the LayerNorms of the sub-layers, in order |
| `encoder.norm`, `decoder.norm` | `encoder_norm`, `decoder_norm` (pre-norm only) |

PyTorch is only needed to call this function, not to import the module.
"""


def _numpy(tensor):
    return tensor.detach().cpu().numpy()


def _copy_attention(torch_attention, attention):
    d_model = torch_attention.embed_dim
    heads = torch_attention.num_heads
    if not torch_attention._qkv_same_embed_dim:
        raise ValueError("Only torch attention with kdim == vdim == embed_dim is supported.")
    weight = _numpy(torch_attention.in_proj_weight)
    bias = _numpy(torch_attention.in_proj_bias)
    for i, dense in enumerate((attention.query_dense, attention.key_dense, attention.value_dense)):
        rows = slice(i * d_model, (i + 1) * d_model)
        dense.kernel.assign(weight[rows].T.reshape(d_model, heads, -1))
        dense.bias.assign(bias[rows].reshape(heads, -1))
    out = torch_attention.out_proj
    attention.output_dense.kernel.assign(_numpy(out.weight).T.reshape(heads, -1, d_model))
    attention.output_dense.bias.assign(_numpy(out.bias))


def _copy_dense(linear, dense):
    dense.kernel.assign(_numpy(linear.weight).T)
    dense.bias.assign(_numpy(linear.bias))


def _copy_norm(torch_norm, norm):
    norm.gamma.assign(_numpy(torch_norm.weight))
    norm.beta.assign(_numpy(torch_norm.bias))


def _copy_feed_forward(torch_layer, feed_forward):
    _copy_dense(torch_layer.linear1, feed_forward.inner_dense)
    _copy_dense(torch_layer.linear2, feed_forward.output_dense)


def copy_torch_transformer_weights(torch_transformer, backbone):
    """Copies a `torch.nn.Transformer`'s weights into `backbone`'s stacks.

    The two must agree on the number of layers, d_model, the number of
    heads, d_ff and pre- or post-norm. The backbone's embeddings are left as
    they are (torch's model has none).

    Args:
        torch_transformer: a `torch.nn.Transformer`.
        backbone: a `keras_transformer.models.TransformerBackbone`.

    Example:

    ```python
    torch_model = torch.nn.Transformer(
        d_model=64, nhead=4, num_encoder_layers=2, num_decoder_layers=2,
        dim_feedforward=128, dropout=0.0, batch_first=True,
    )
    # The paper's post-norm layers have no final LayerNorm; torch adds one.
    torch_model.encoder.norm = None
    torch_model.decoder.norm = None
    backbone = TransformerBackbone(
        vocabulary_size=100, num_layers=2, d_model=64, num_heads=4, d_ff=128
    )
    copy_torch_transformer_weights(torch_model, backbone)
    ```
    """
    torch_encoder = torch_transformer.encoder.layers
    torch_decoder = torch_transformer.decoder.layers
    if len(torch_encoder) != len(backbone.encoder_layers) or len(torch_decoder) != len(
        backbone.decoder_layers
    ):
        raise ValueError(
            f"Layer counts differ: torch has {len(torch_encoder)} encoder and "
            f"{len(torch_decoder)} decoder layers, the backbone "
            f"{len(backbone.encoder_layers)} and {len(backbone.decoder_layers)}."
        )
    for torch_layer, layer in zip(torch_encoder, backbone.encoder_layers):
        _copy_attention(torch_layer.self_attn, layer.self_attention)
        _copy_feed_forward(torch_layer, layer.feed_forward)
        _copy_norm(torch_layer.norm1, layer.self_attention_norm)
        _copy_norm(torch_layer.norm2, layer.feed_forward_norm)
    for torch_layer, layer in zip(torch_decoder, backbone.decoder_layers):
        _copy_attention(torch_layer.self_attn, layer.self_attention)
        _copy_attention(torch_layer.multihead_attn, layer.cross_attention)
        _copy_feed_forward(torch_layer, layer.feed_forward)
        _copy_norm(torch_layer.norm1, layer.self_attention_norm)
        _copy_norm(torch_layer.norm2, layer.cross_attention_norm)
        _copy_norm(torch_layer.norm3, layer.feed_forward_norm)
    for side in ("encoder", "decoder"):
        torch_norm = getattr(torch_transformer, side).norm
        norm = getattr(backbone, f"{side}_norm")
        if (torch_norm is None) != (norm is None):
            raise ValueError(
                f"The torch {side} {'has' if torch_norm is not None else 'lacks'} a "
                f"final LayerNorm but the backbone (normalize_first="
                f"{backbone.normalize_first}) {'lacks' if norm is None else 'has'} "
                "one. For the paper's post-norm, set the torch model's "
                f"`{side}.norm = None`."
            )
        if norm is not None:
            _copy_norm(torch_norm, norm)
    return backbone


__all__ = ["copy_torch_transformer_weights"]
