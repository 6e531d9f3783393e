"""Model formats outside loopnet's own checkpoints: the Hugging Face layout a model is exported to
(`loopnet.formats.hf`), and the files shipped with it (`configuration_loopnet`, `modeling_loopnet`)."""
