"""Model stages: initial checkpoint (new Llama or a local base model)."""
