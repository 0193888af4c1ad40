"""The partition backend: ``model.py`` and the modules it loads from beside it are copied into every
generated partition model's version directory (see model.py's docstring)."""

from pathlib import Path

from profiling import engines as _engines  # the one module of the project a backend uses (copied beside it)

_HERE = Path(__file__).resolve().parent
MODEL_PY = _HERE / "model.py"
# Every file of a partition model's version directory besides the ONNX file: model.py and its siblings.
ENGINE_FILES = (Path(_engines.__file__).resolve(), Path(_engines.__file__).resolve().with_name("engine_trt.py"))
BACKEND_FILES = (MODEL_PY, *ENGINE_FILES, _HERE / "emulated.py")
