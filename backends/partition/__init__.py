"""The partition backend: ``model.py`` and the modules it loads from beside it are copied into every
generated partition model's version directory (see model.py's docstring)."""

from pathlib import Path

from profiling import engines as _engines  # the one module of the project a backend uses (copied beside it)

_HERE = Path(__file__).resolve().parent
MODEL_PY = _HERE / "model.py"
# Every file of a partition model's version directory besides the ONNX file: model.py and its siblings.
BACKEND_FILES = (MODEL_PY, Path(_engines.__file__).resolve(), _HERE / "emulated.py")
