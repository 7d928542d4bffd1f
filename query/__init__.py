"""Query: time-window questions over the store, as a gRPC service and a Python client.

from query import Client
client = Client("127.0.0.1:50051")
client.series(["gpu.util"], run="...")   # a pandas DataFrame
"""

from query.client import Client, QueryFailed

__all__ = ["Client", "QueryFailed"]
