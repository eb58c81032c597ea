"""CPU built-ins registered by the core through the same hooks as any plugin."""
