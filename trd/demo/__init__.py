"""The demo's models: a real small model imported once into the cache."""
