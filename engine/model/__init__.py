"""The base model: resolved, loaded and adapted with LoRA; chats tokenised with labels on the responses."""
