"""Training drafters for a target: corpus building, target feature caching, DFlash and PARD training,
checkpoints and evaluation (`cure train-drafter`)."""
