"""Group vectors at theta_0: SFT gradients, task vectors or GRPO gradients, packed in batches and projected."""
