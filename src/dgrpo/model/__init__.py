"""The latent model: Coconut recurrence on a Hugging Face causal LM (latent_lm), its tokenizer and latent markers
(tokens), answer decoding and sampling (decoding), its loading, LoRA, kernels and the fast engine's fixed-shape
decoding."""
