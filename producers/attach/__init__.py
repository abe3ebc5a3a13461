"""Attach CCL-D to PyTorch jobs (torch.distributed)."""
