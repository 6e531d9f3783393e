"""Model formats loopnet reads and writes: its own model folder in the Hugging Face layout (`loopnet.formats.hf`, its
one writer and reader, with the files shipped with it, `configuration_loopnet` and `modeling_loopnet`; `folder` opens
one as a model), and the released looped LMs it imports (`huginn`, `ouro`, `parcae`) and the pretrained models it
retrofits into loops (`retrofit`), each read from the source's own layout and written as loopnet's folder."""
