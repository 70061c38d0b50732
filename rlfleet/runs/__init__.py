"""What starts roles and loops: local mode's fleet (`launcher`), the actor supervisor, device
placement, and the in-process loops (SFT, its bootstrap, DAgger, demo collection)."""
