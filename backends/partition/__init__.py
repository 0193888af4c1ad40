"""The partition backend: ``model.py`` is copied into every generated partition model (see its docstring)."""

from pathlib import Path

MODEL_PY = Path(__file__).resolve().parent / "model.py"
