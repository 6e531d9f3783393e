"""GPT-2's vocabulary, as numbers: light to import (no tokenizer, no `datasets`), for every module
that needs the size without the BPE itself (the CLI's checks, the eval adapter, the unigram plateau)."""

N_VOCAB = 50257  # GPT-2 BPE's token ids; LoopConfig.vocab_size pads it to a multiple of 64 (50304)
EOT_ID = 50256  # <|endoftext|>, appended after every document
EOT_TEXT = "<|endoftext|>"
