"""The Qt desktop app. All model work happens on a worker thread (worker.py); widgets only render."""

THEMES = ("system", "light", "dark")  # here, free of Qt, so the command line can offer them without loading it
