"""The Qt desktop app. All model work happens on a worker thread (worker.py); widgets only render."""
