"""Hot paths: the stream's history, detection, blocks, their runs and regression checks."""
