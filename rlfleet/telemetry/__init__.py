"""Operations telemetry: the Prometheus endpoint of each role and structured (JSON) logs."""
