"""Profiles: the data model, ONNX graph helpers, cut points, pre-partitioning, engines, the profiler, merge,
the PPipe reference importer and the zoo of small models."""
