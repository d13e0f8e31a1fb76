"""Torch model code, weight loading (GGUF, safetensors), tokenizers, sampling."""
