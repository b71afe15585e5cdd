"""The engine on this machine: its data and cache paths, file locks, child processes, storage errors, the
model catalog and downloads, and the kernel warm-up."""
