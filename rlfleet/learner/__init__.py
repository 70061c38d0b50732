"""The learner role: segment ingest, the training loop, DDP, weight publishing, checkpoints."""
