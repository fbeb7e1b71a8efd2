"""Plain PyTorch backend: transformers LlamaForCausalLM (SDPA), AdamW, DDP under torchrun."""
