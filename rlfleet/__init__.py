"""rlfleet: RL fine-tuning of robot policies in simulation, at fleet scale."""
