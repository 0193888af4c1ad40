"""gRPC settings of every channel and server the sidecar opens: no message size limit (a batch's tensors are large)."""

GRPC_OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
