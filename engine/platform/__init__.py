"""The engine on this machine: its data and cache paths, file locks, child processes, storage errors, the
chosen compute backend, the model catalog and downloads, and the kernel warm-up."""
