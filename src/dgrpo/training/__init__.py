"""Training: Coconut SFT (sft), Dropout-GRPO (grpo, rollouts, losses, schedules, ref_policy), and what every run
needs (run directories, checkpoints, tracking, preemption, torch.distributed)."""
