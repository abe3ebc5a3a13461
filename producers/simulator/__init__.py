"""Fault-injecting discrete-event simulator of a training job."""
