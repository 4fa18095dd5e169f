"""The edge's HTTP and WebSocket routes, one module per concern."""
