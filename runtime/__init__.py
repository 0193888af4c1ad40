"""Running Triton: the tritonserver process, `poolpipe launch`, a `Deployment` of many servers, the sidecar
process."""
