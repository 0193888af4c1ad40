"""gRPC settings of every channel and server the sidecar opens: no message size limit (a batch's tensors are large)."""

GRPC_OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]

# gRPC core cancels (status CANCELLED, nothing else said) calls that arrive while more than max_pending_requests
# (1,000 by default) wait for the Python server to pick them up: a burst of a few thousand requests lost hundreds
# that way. The sidecar admits or sheds every request itself, with an explicit error, so core keeps them all.
SERVER_OPTIONS = [*GRPC_OPTIONS, ("grpc.server.max_pending_requests", 1 << 20),
                  ("grpc.server.max_pending_requests_hard_limit", 1 << 20)]
