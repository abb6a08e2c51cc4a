"""The training loop, objectives, run directories and checkpoints."""
