"""The partition backend: ``model.py`` and the modules it loads from beside it are copied into every
generated partition model's version directory (see model.py's docstring)."""

from pathlib import Path

_HERE = Path(__file__).resolve().parent
MODEL_PY = _HERE / "model.py"
# Every file of a partition model's version directory besides the ONNX file: model.py and its siblings.
BACKEND_FILES = (MODEL_PY, _HERE / "engines.py", _HERE / "emulated.py")
