"""Evaluation: batched pass@1 and majority voting of latent models (evaluate) and the answer scorers (scoring)."""
