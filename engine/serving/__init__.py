"""What the app, the CLI and the server talk to: chat sessions on a local model, the engine service that
runs many at once, and remote engines behind the same interface."""
