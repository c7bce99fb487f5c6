"""The Job Agent: switches the Runtime features over gRPC."""
