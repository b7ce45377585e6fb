"""The OpenAI-compatible HTTP server (stdlib `ThreadingHTTPServer`)."""
