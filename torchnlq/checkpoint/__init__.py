"""Checkpoints and exports: DCP save/resume, the metadata beside a checkpoint, loading for inference,
safetensors and Hugging Face GPT-2 export."""
