"""What runs read: the embedded model (embedded), the tasks' data and its local copies (taskdata), the reference
corpus and its infini-gram index (corpus, infinigram_index), the tokenizer vocabulary's facts (vocabulary), and
where decodebench keeps what it builds (paths)."""
