"""The graph dump's scenes: the model dump, the overflow dump and the watcher."""
