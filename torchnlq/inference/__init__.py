"""Using a trained model: sampling with a KV cache, evaluation, model summaries."""
