"""A small model zoo built locally with ``onnx.helper``: ResNet-, MobileNet- and segmentation-style CNNs.

The models have deterministic random weights (``numpy.random.RandomState(seed)``), no downloads,
opset 17, one FP32 input named ``input`` of shape ``[batch, 3, H, W]`` with a dynamic batch dimension,
and one output with a dynamic batch dimension (``logits`` for the classifiers, ``mask`` for segnet).
They are sized so that ONNX Runtime on a 2-core CPU runs one request in a few milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from poolpipe_common.errors import InputError

ZOO_MODELS = ("resnet", "mobilenet", "segnet")
OPSET = 17
BATCH_DIM = "batch"
NUM_CLASSES = 10
SEG_CLASSES = 4
INPUT_HW = {"resnet": 112, "mobilenet": 192, "segnet": 96}


@dataclass
class _GraphBuilder:
    """Accumulates nodes and initializers with unique, readable names (``/stage1/block0/conv1``)."""

    rng: np.random.RandomState
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    inits: list[onnx.TensorProto] = field(default_factory=list)

    def _init(self, name: str, arr: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(arr.astype(np.float32), name))
        return name

    def node(self, op: str, inputs: list[str], name: str, **attrs) -> str:
        out = f"{name}_output_0"
        self.nodes.append(helper.make_node(op, inputs, [out], name=name, **attrs))
        return out

    def conv(self, x: str, cin: int, cout: int, name: str, k: int = 3, stride: int = 1, groups: int = 1,
             relu: bool = True) -> str:
        """Conv (batch norm folded into weight and bias, He-initialised) optionally followed by Relu."""
        fan_in = cin // groups * k * k
        w = self.rng.randn(cout, cin // groups, k, k) * np.sqrt((2.0 if relu else 1.0) / fan_in)
        b = self.rng.randn(cout) * 0.01
        y = self.node("Conv", [x, self._init(f"{name}.weight", w), self._init(f"{name}.bias", b)], name,
                      kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4, group=groups)
        return self.node("Relu", [y], f"{name}/relu") if relu else y

    def conv_transpose(self, x: str, cin: int, cout: int, name: str) -> str:
        """2x learned upsampling (kernel 2, stride 2) followed by Relu."""
        w = self.rng.randn(cin, cout, 2, 2) * np.sqrt(2.0 / (cin * 4))
        b = self.rng.randn(cout) * 0.01
        y = self.node("ConvTranspose", [x, self._init(f"{name}.weight", w), self._init(f"{name}.bias", b)],
                      name, kernel_shape=[2, 2], strides=[2, 2])
        return self.node("Relu", [y], f"{name}/relu")

    def head(self, x: str, cin: int, classes: int) -> str:
        """Global average pool -> flatten -> fully connected: the classifier's ``logits``."""
        p = self.node("GlobalAveragePool", [x], "/head/pool")
        f = self.node("Flatten", [p], "/head/flatten", axis=1)
        w = self.rng.randn(classes, cin) * np.sqrt(1.0 / cin)
        b = self.rng.randn(classes) * 0.01
        self.nodes.append(helper.make_node("Gemm", [f, self._init("fc.weight", w), self._init("fc.bias", b)],
                                           ["logits"], name="/head/fc", transB=1))
        return "logits"


def _resnet(g: _GraphBuilder) -> tuple[str, int]:
    """ResNet-style: stem, three stages of two basic residual blocks (Add skips, strided 1x1 shortcuts)."""
    x = g.conv("input", 3, 32, "/stem/conv", stride=2)
    cin = 32
    for s, (cout, stride) in enumerate([(32, 1), (64, 2), (128, 2)]):
        for b in range(2):
            name = f"/stage{s + 1}/block{b}"
            st = stride if b == 0 else 1
            y = g.conv(x, cin, cout, f"{name}/conv1", stride=st)
            y = g.conv(y, cout, cout, f"{name}/conv2", relu=False)
            short = x if (st == 1 and cin == cout) else g.conv(x, cin, cout, f"{name}/shortcut", k=1,
                                                                 stride=st, relu=False)
            x = g.node("Relu", [g.node("Add", [y, short], f"{name}/add")], f"{name}/relu")
            cin = cout
    return g.head(x, cin, NUM_CLASSES), NUM_CLASSES


def _mobilenet(g: _GraphBuilder) -> tuple[str, int]:
    """MobileNetV2-style: inverted residual blocks (1x1 expand, 3x3 depthwise, 1x1 linear project)."""
    x = g.conv("input", 3, 32, "/stem/conv", stride=2)
    cin = 32
    # (expansion, out channels, repeats, first stride)
    for s, (t, cout, n, stride) in enumerate([(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 3, 2),
                                              (6, 96, 2, 1)]):
        for b in range(n):
            name = f"/stage{s + 1}/block{b}"
            st = stride if b == 0 else 1
            hidden = cin * t
            y = g.conv(x, cin, hidden, f"{name}/expand", k=1) if t != 1 else x
            y = g.conv(y, hidden, hidden, f"{name}/depthwise", stride=st, groups=hidden)
            y = g.conv(y, hidden, cout, f"{name}/project", k=1, relu=False)
            x = g.node("Add", [y, x], f"{name}/add") if (st == 1 and cin == cout) else y
            cin = cout
    x = g.conv(x, cin, 256, "/last/conv", k=1)
    return g.head(x, 256, NUM_CLASSES), NUM_CLASSES


def _segnet(g: _GraphBuilder) -> tuple[str, int]:
    """U-Net-style encoder-decoder: strided encoder, ConvTranspose and Resize upsampling, Concat/Add skips."""
    e1 = g.conv(g.conv("input", 3, 16, "/enc1/conv1"), 16, 16, "/enc1/conv2")           # H
    e2 = g.conv(g.conv(e1, 16, 32, "/enc2/conv1", stride=2), 32, 32, "/enc2/conv2")     # H/2
    e3 = g.conv(g.conv(e2, 32, 64, "/enc3/conv1", stride=2), 64, 64, "/enc3/conv2")     # H/4
    mid = g.conv(g.conv(e3, 64, 64, "/mid/conv1", stride=2), 64, 64, "/mid/conv2")       # H/8
    u3 = g.conv_transpose(mid, 64, 64, "/dec3/up")                                      # H/4
    d3 = g.conv(g.node("Concat", [u3, e3], "/dec3/concat", axis=1), 128, 64, "/dec3/conv")
    scales = g._init("/dec2/up.scales", np.array([1, 1, 2, 2], dtype=np.float32))
    u2 = g.node("Resize", [d3, "", scales], "/dec2/up", mode="nearest")                # H/2, 64 ch
    d2 = g.conv(g.node("Concat", [u2, e2], "/dec2/concat", axis=1), 96, 32, "/dec2/conv")
    u1 = g.conv_transpose(d2, 32, 16, "/dec1/up")                                       # H
    d1 = g.conv(g.node("Add", [u1, e1], "/dec1/add"), 16, 16, "/dec1/conv")
    w = g.rng.randn(SEG_CLASSES, 16, 1, 1) * np.sqrt(1.0 / 16)
    b = g.rng.randn(SEG_CLASSES) * 0.01
    g.nodes.append(helper.make_node("Conv", [d1, g._init("/classifier.weight", w), g._init("/classifier.bias", b)],
                                    ["mask"], name="/classifier", kernel_shape=[1, 1]))
    return "mask", SEG_CLASSES


_BUILDERS: dict[str, Callable[[_GraphBuilder], tuple[str, int]]] = {
    "resnet": _resnet, "mobilenet": _mobilenet, "segnet": _segnet}


def zoo_model(name: str, seed: int = 0, input_hw: int | None = None) -> onnx.ModelProto:
    """The zoo model ``name`` as an in-memory, checked ONNX model; ``input_hw`` overrides the image size
    (work grows with its square: resnet at 224 takes about 4x its default 112)."""
    if name not in _BUILDERS:
        raise InputError(f"unknown zoo model {name!r}; choose one of {', '.join(ZOO_MODELS)}")
    hw = input_hw or INPUT_HW[name]
    if hw % 16 or hw < 32:
        raise InputError(f"input size {hw}: use a multiple of 16, at least 32 (the models downsample 16x)")
    g = _GraphBuilder(np.random.RandomState(seed))
    out, channels = _BUILDERS[name](g)
    inp = helper.make_tensor_value_info("input", TensorProto.FLOAT, [BATCH_DIM, 3, hw, hw])
    out_shape = [BATCH_DIM, channels] if out == "logits" else [BATCH_DIM, channels, hw, hw]
    outp = helper.make_tensor_value_info(out, TensorProto.FLOAT, out_shape)
    graph = helper.make_graph(g.nodes, f"poolpipe_zoo_{name}", [inp], [outp], initializer=g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="poolpipe.zoo", doc_string=f"poolpipe zoo {name}, seed {seed}")
    model.ir_version = 8  # readable by every onnxruntime >= 1.14
    onnx.checker.check_model(model, full_check=True)
    return model


def build_zoo_model(name: str, out_path: Path, seed: int = 0, input_hw: int | None = None) -> Path:
    """Write zoo model ``name`` (weights from ``RandomState(seed)``) to ``out_path``; returns the path."""
    out_path = Path(out_path)
    model = zoo_model(name, seed, input_hw)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(out_path))
    return out_path
