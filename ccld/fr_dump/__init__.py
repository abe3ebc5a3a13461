"""The PyTorch Flight Recorder dump model, shared by the live poller and the post-mortem import."""
