"""The latent model: Coconut recurrence on a Hugging Face causal LM (latent_lm), its loading, LoRA, kernels and the
fast engine's fixed-shape decoding."""
