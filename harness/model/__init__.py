"""Llama-family model code: config (config.py), HF config resolution (hf_config.py), the torch
model (llama.py) and weight filling (weights.py). Import from the modules themselves: this
package imports nothing, so reading a config never loads torch."""
