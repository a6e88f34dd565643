"""Structural features of a built ``tf.keras`` model: size, layer mix, FLOPs and activation memory.

The FLOP count is analytic (no profiler): a multiply-add counts as 2 FLOPs.

* ``Conv2D``: 2 · H_out · W_out · C_out · (k_h · k_w · C_in / groups) (+ H_out · W_out · C_out for the bias)
* ``DepthwiseConv2D``: 2 · H_out · W_out · C_out · k_h · k_w (+ bias)
* ``Conv1D``: 2 · L_out · C_out · k · C_in (+ bias)
* ``Dense``: 2 · rows · units · in_features (+ bias), ``rows`` = product of leading non-batch dims
* every other layer (activations, pooling, normalisation, ...): one FLOP per output element.

A training step costs about 3× the forward pass (forward, gradient w.r.t. activations, gradient
w.r.t. weights).  Activation memory is the sum of all layer outputs per sample, in float32.

The layer mix tells the kinds of network apart (docs/ARCHITECTURE.md, "The learned estimator"):
normalisation layers (``norm_layers``, and their outputs, ``norm_bytes_per_sample``: several
passes over memory forward and backward for one FLOP an element), merges such as a residual
``Add`` (``merge_layers``), global pooling (``global_pool_layers``), depthwise convolutions (their
training FLOPs, ``depthwise_flops_per_sample``, also counted in the conv FLOPs: few FLOPs per byte
moved, so slower per FLOP than a full conv), the outputs of layers that apply their own non-linear
activation (``activated_bytes_per_sample``: a ``Conv2D`` or ``Dense`` with ``activation="relu"``
makes its pre-activation too, a second tensor of the same size), embeddings (``embedding_params``, and their looked-up
outputs, ``embedding_bytes_per_sample``: a gather forward, a sparse gradient backward) and the
longest path from the input to the output in layers (``depth``; ``num_layers`` for a chain).

The conv FLOPs at a vector width (``conv_flops_simd8_per_sample``, ``conv_flops_simd16_per_sample``)
count each ``Conv2D`` and ``DepthwiseConv2D`` with its channels rounded up to 8 or 16 floats, the
width of an AVX2 or AVX-512 register.  oneDNN, TensorFlow's CPU kernels, lays channels out in
blocks of that width, so a layer of 8 filters costs on AVX-512 what one of 16 costs.  Input
channels under 4 (a first layer's 1 or 3) are not rounded: such an input is read unblocked.
Measured on the sweep's CNNs with 8 filters, this is why they ran 1.5-2 times slower per FLOP
than those with 16 or more.  The laws weigh these FLOPs beside the plain ones, so cross-validation
finds the width a device type has, or none.

The convs' backprop workspace (``conv_workspace_bytes``, per model, not per sample) is the
largest scratch buffer that TensorFlow's own CPU kernels for a ``Conv2D``'s (and a ``Conv1D``'s,
which runs as a ``Conv2D`` of height 1) gradient allocate.  They run where oneDNN is off:
TensorFlow's default on CPUs without AVX-512 VNNI, BF16 or AMX, and wherever
``TF_ENABLE_ONEDNN_OPTS=0``; oneDNN's kernels take no such buffer, so the law's coefficient of this
feature is a device type's own (about 1 or more without oneDNN, 0 with it).  TensorFlow's kernels
im2col a shard of the batch into a buffer sized to a 30 MiB working set, whatever the batch.  Per
image the gradient's matmul touches ``A = P · k_h · k_w · C_in`` floats of columns, ``P · C_out``
of output gradient and ``k_h · k_w · C_in · C_out`` of kernel (``P`` output positions); the shard
is ``⌈30 MiB / 4 / (A + B + C)⌉`` images and the buffer that many times ``A`` floats.  So a small
conv layer reserves up to 30 MiB at any batch: measured with one such layer, the step's peak was
the formula's to 1-5% (with oneDNN on, 0.03 MB against 6.7 at B = 1), and in sweeps of every kind
the CNNs, residual and separable CNNs held 20-35 MB more at B = 16 than their parameters and
activations explain, which a memory law without this term put on every model.
(The allocator then hands a request over 16 MiB a whole 32 MiB chunk in most processes measured,
which the law's coefficient absorbs on average; a GPU's cuDNN workspace follows other rules.)
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from pipelines.core.imports import load_tensorflow

BYTES_PER_FLOAT = 4
TRAIN_FLOPS_FACTOR = 3.0
CONV_KINDS = {"Conv1D", "Conv2D", "Conv3D", "DepthwiseConv2D"}
BLOCKED_CONV_KINDS = {"Conv2D", "DepthwiseConv2D"}  # counted by conv_macs, at any vector width
NORM_KINDS = {"BatchNormalization", "LayerNormalization", "GroupNormalization", "UnitNormalization"}
MERGE_KINDS = {"Add", "Subtract", "Multiply", "Average", "Maximum", "Minimum", "Concatenate"}


def _size(shape: Any) -> int:
    """Elements per sample of a Keras output shape (batch dimension dropped, None counts as 1)."""
    if isinstance(shape, list):  # multi-output layer
        return sum(_size(s) for s in shape)
    dims = tuple(shape)[1:]
    return math.prod(int(d) if d is not None else 1 for d in dims)


def _leaf_layers(model: Any) -> list[Any]:
    """All layers, with nested models (e.g. a Sequential inside a functional model) flattened."""
    out = []
    for layer in model.layers:
        if hasattr(layer, "layers") and layer.__class__.__name__ in {"Sequential", "Functional", "Model"}:
            out.extend(_leaf_layers(layer))
        else:
            out.append(layer)
    return out


def layer_flops(layer: Any) -> int:
    """Forward FLOPs per sample of one built layer (see the module docstring for the rules)."""
    kind = layer.__class__.__name__
    out_elems = _size(layer.output_shape)
    use_bias = bool(getattr(layer, "use_bias", False))
    if kind in {"InputLayer"}:
        return 0
    if kind in BLOCKED_CONV_KINDS:
        return 2 * conv_macs(layer) + (out_elems if use_bias else 0)
    if kind == "Conv1D":
        (k,) = layer.kernel_size
        cin = int(layer.input_shape[-1])
        return 2 * out_elems * k * cin + (out_elems if use_bias else 0)
    if kind == "Dense":
        fan_in = int(layer.input_shape[-1])
        return 2 * out_elems * fan_in + (out_elems if use_bias else 0)
    if kind in {"Flatten", "Reshape", "Dropout"}:
        return 0
    return out_elems


SIMD_WIDTHS = (8, 16)  # floats per vector register: AVX2, AVX-512
UNBLOCKED_INPUT_CHANNELS = 4  # fewer input channels than this are read as they are, not in blocks


def _rounded(channels: int, width: int) -> int:
    return -(-channels // width) * width


def conv_macs(layer: Any, width: int = 1) -> int:
    """Multiply-adds per sample of a ``Conv2D`` or ``DepthwiseConv2D``, with its channels rounded
    up to ``width`` (see the module docstring; 1: as they are)."""
    kh, kw = layer.kernel_size
    cout = int(layer.output_shape[-1])
    positions = _size(layer.output_shape) // cout
    if layer.__class__.__name__ == "DepthwiseConv2D":  # each output channel reads its own input channel
        return positions * _rounded(cout, width) * kh * kw
    per_group = int(layer.input_shape[-1]) // int(getattr(layer, "groups", 1) or 1)
    fan_in = per_group if per_group < UNBLOCKED_INPUT_CHANNELS else _rounded(per_group, width)
    return positions * _rounded(cout, width) * kh * kw * fan_in


def vector_conv_flops(layer: Any, width: int) -> int:
    """Forward FLOPs per sample of a ``Conv2D`` or ``DepthwiseConv2D`` with its channels rounded up
    to ``width``; 0 for any other layer.  The bias is left out: it is elementwise, not blocked
    arithmetic."""
    return 2 * conv_macs(layer, width) if layer.__class__.__name__ in BLOCKED_CONV_KINDS else 0


CONV_GRAD_WORKING_SET_FLOATS = (30 << 20) // BYTES_PER_FLOAT  # TensorFlow's CPU conv gradient kernels


def conv_workspace_bytes(layer: Any) -> int:
    """The im2col buffer that a ``Conv2D``'s or ``Conv1D``'s gradient allocates on the CPU (see the
    module docstring), in bytes; 0 for any other layer."""
    kind = layer.__class__.__name__
    if kind not in {"Conv2D", "Conv1D"}:
        return 0
    window = math.prod(int(k) for k in layer.kernel_size)
    cout = int(layer.output_shape[-1])
    positions = _size(layer.output_shape) // cout
    fan_in = int(layer.input_shape[-1]) // int(getattr(layer, "groups", 1) or 1)
    columns = positions * window * fan_in
    work_unit = columns + positions * cout + window * fan_in * cout
    shard = -(-CONV_GRAD_WORKING_SET_FLOATS // work_unit)
    return shard * columns * BYTES_PER_FLOAT


def _activated(layer: Any) -> bool:
    """Whether ``layer`` applies a non-linear activation of its own (``activation=`` not linear)."""
    activation = getattr(layer, "activation", None)
    return activation is not None and getattr(activation, "__name__", "linear") != "linear"


def depth(layers: list[Any]) -> int:
    """The longest path through ``layers`` (in topological order, as a model lists them), in
    layers: each counts one more than the deepest layer feeding it.  Inputs count 0."""
    tf = load_tensorflow()

    deepest: dict[int, int] = {}
    for layer in layers:
        if layer.__class__.__name__ == "InputLayer":
            deepest[id(layer)] = 0
            continue
        parents = [p for node in getattr(layer, "_inbound_nodes", []) for p in tf.nest.flatten(node.inbound_layers)]
        deepest[id(layer)] = 1 + max((deepest.get(id(p), 0) for p in parents), default=0)
    return max(deepest.values(), default=0)


def model_features(model: Any) -> dict[str, Any]:
    """Features of a built Keras model.

    Returns ``params``, ``trainable_params``, ``variables``, ``trainable_variables``, ``param_bytes``, ``layers`` (count by layer type),
    ``num_layers``, ``conv_filters`` (list, in order), ``dense_units`` (list, in order),
    ``input_size`` (elements per sample), ``output_size``, ``flops_per_sample`` (forward),
    ``train_flops_per_sample`` (≈ 3× forward), ``activation_bytes_per_sample`` (sum of every
    layer's output size × 4 bytes, input included), the layer mix, the conv FLOPs at each vector
    width and the convs' backprop workspace of the module docstring.
    """
    import numpy as np

    leaves = _leaf_layers(model)
    counts = Counter(layer.__class__.__name__ for layer in leaves)
    params = int(model.count_params())
    trainable = int(sum(int(np.prod(w.shape)) for w in model.trainable_weights))
    input_size = _size(model.input_shape)
    flops = conv_flops = dense_flops = depthwise_flops = workspace = 0
    norm_elems = activated_elems = embedding_elems = embedding_params = 0
    vector_flops = dict.fromkeys(SIMD_WIDTHS, 0)
    activations = input_size
    conv_filters: list[int] = []
    dense_units: list[int] = []
    for layer in leaves:
        kind = layer.__class__.__name__
        if kind == "InputLayer":
            continue
        f = layer_flops(layer)
        flops += f
        out = _size(layer.output_shape)
        conv_flops += f if kind in CONV_KINDS else 0
        depthwise_flops += f if kind == "DepthwiseConv2D" else 0
        dense_flops += f if kind == "Dense" else 0
        for width in SIMD_WIDTHS:
            vector_flops[width] += vector_conv_flops(layer, width)
        activations += out
        workspace = max(workspace, conv_workspace_bytes(layer))  # one layer's gradient at a time
        norm_elems += out if kind in NORM_KINDS else 0
        activated_elems += out if kind != "Activation" and _activated(layer) else 0
        if kind == "Embedding":
            embedding_elems += out
            embedding_params += int(layer.count_params())
        if kind in {"Conv1D", "Conv2D", "Conv3D"}:
            conv_filters.append(int(layer.filters))
        elif kind == "Dense":
            dense_units.append(int(layer.units))
    return {
        "params": params,
        "trainable_params": trainable,
        "variables": len(model.variables),  # what a Horovod start broadcasts, one op each
        "trainable_variables": len(model.trainable_variables),  # a gradient each, allreduced in a Horovod step
        "param_bytes": params * BYTES_PER_FLOAT,
        "layers": dict(sorted(counts.items())),
        "num_layers": len(leaves),
        "conv_filters": conv_filters,
        "dense_units": dense_units,
        "input_size": int(input_size),
        "output_size": int(_size(model.output_shape)),
        "flops_per_sample": int(flops),
        "train_flops_per_sample": int(TRAIN_FLOPS_FACTOR * flops),
        "conv_flops_per_sample": int(TRAIN_FLOPS_FACTOR * conv_flops),  # training FLOPs of conv layers
        "dense_flops_per_sample": int(TRAIN_FLOPS_FACTOR * dense_flops),  # training FLOPs of dense layers
        "activation_bytes_per_sample": int(activations * BYTES_PER_FLOAT),
        "norm_layers": sum(counts[k] for k in NORM_KINDS),
        "merge_layers": sum(counts[k] for k in MERGE_KINDS),
        "global_pool_layers": sum(n for k, n in counts.items() if k.startswith("Global") and "Pooling" in k),
        "embedding_params": embedding_params,
        "depth": depth(leaves),
        "depthwise_flops_per_sample": int(TRAIN_FLOPS_FACTOR * depthwise_flops),  # also in conv_flops_per_sample
        "norm_bytes_per_sample": int(norm_elems * BYTES_PER_FLOAT),
        "activated_bytes_per_sample": int(activated_elems * BYTES_PER_FLOAT),
        "embedding_bytes_per_sample": int(embedding_elems * BYTES_PER_FLOAT),
        # training FLOPs of the convs with their channels rounded up to a vector width
        **{f"conv_flops_simd{w}_per_sample": int(TRAIN_FLOPS_FACTOR * vector_flops[w]) for w in SIMD_WIDTHS},
        "conv_workspace_bytes": int(workspace),  # per model: the largest conv gradient's scratch buffer
    }

