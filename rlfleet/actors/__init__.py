"""The actor role: env worker processes, shared-memory slots, segments pushed to the learner."""
