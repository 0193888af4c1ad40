"""Triton's model-control API, for loading the next generation's partition models into a running server.

A server keeps the repository it was started with, so a model of another repository travels in the load request
itself: its config (as JSON) and every file of its version directories (Triton's load with file overrides). The
servers run with ``--model-control-mode=explicit`` (runtime.tritonserver, generated launch.sh).
"""

from __future__ import annotations

from pathlib import Path

import tritonclient.http as httpclient
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

from model_repository_gen.k8s_pods import FIRST_BUILD_S

LOAD_TIMEOUT_S = float(FIRST_BUILD_S)  # a load may build a TensorRT engine first (model_repository_gen.k8s_pods)


def model_files(model_dir: Path) -> dict[str, bytes]:
    """``file:<path>`` -> bytes for every file of a model directory but its config (caches left out)."""
    return {f"file:{p.relative_to(model_dir).as_posix()}": p.read_bytes() for p in sorted(model_dir.rglob("*"))
            if p.is_file() and p.name != "config.pbtxt" and "__pycache__" not in p.parts}


def config_json(model_dir: Path) -> str:
    cfg = text_format.Parse((model_dir / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    return json_format.MessageToJson(cfg)


def same_model(a: Path, b: Path) -> bool:
    """Two model directories with the same config and files (a kept server may keep such a model loaded)."""
    return ((a / "config.pbtxt").read_bytes() == (b / "config.pbtxt").read_bytes()
            and model_files(a) == model_files(b))


def _client(http_url: str) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(http_url, connection_timeout=LOAD_TIMEOUT_S,
                                            network_timeout=LOAD_TIMEOUT_S)


def load_model_dir(http_url: str, model_dir: Path) -> None:
    """Load the model in ``model_dir`` (named by its directory) into the server at ``http_url``; RuntimeError
    saying which server and model when Triton refuses (e.g. a server not in explicit model-control mode)."""
    client = _client(http_url)
    try:
        client.load_model(model_dir.name, config=config_json(model_dir), files=model_files(model_dir))
    except InferenceServerException as e:
        raise RuntimeError(f"tritonserver {http_url} could not load model {model_dir.name}: {e.message()} "
                           "(servers must run with --model-control-mode=explicit; launch.sh and 'poolpipe launch' "
                           "start them so)") from None
    finally:
        client.close()


def unload_model(http_url: str, name: str) -> None:
    """Unload ``name`` (requests already inside the server finish first, Triton's own rule)."""
    client = _client(http_url)
    try:
        client.unload_model(name)
    except InferenceServerException as e:
        raise RuntimeError(f"tritonserver {http_url} could not unload model {name}: {e.message()}") from None
    finally:
        client.close()

