"""The inference role: batched policy serving over shm, ZeroMQ and gRPC; weight subscription."""
