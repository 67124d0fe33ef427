"""Engines: one model, its paged KV cache, its scheduler, and the step loop."""
