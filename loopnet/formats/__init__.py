"""Model formats loopnet reads and writes: the Hugging Face layout a model is exported to (`loopnet.formats.hf`,
with the files shipped with it, `configuration_loopnet` and `modeling_loopnet`), the released looped LMs it
imports (`huginn`, `ouro`, `parcae`), pretrained models retrofitted into loops (`retrofit`) and its own folder (`folder`)."""
